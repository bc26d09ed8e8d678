"""Plots from the chapter's traces: the overlap timeline, memory per rank against the formula, panel figures."""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

PARTS = (("held_params", "parameters", "tab:blue"), ("held_grads", "gradients", "tab:orange"),
         ("held_optimizer", "optimizer state", "tab:green"))


def plot_timeline(ax: Axes, trace: pd.DataFrame, step: int | None = None, rank: int = 0) -> None:
    """One rank's step as a Gantt chart: the last backward pass and each bucket's allreduce, in milliseconds."""
    t = trace[trace.worker == rank]
    if step is None:
        done = t[t.event == "update"]
        if not len(done):  # a live trace may not have this rank's first step yet
            return
        step = int(done.step.max())
    t = t[t.step == step]
    upd = t[t.event == "update"]
    if not len(upd):
        return
    origin = float(upd.start.iloc[0])
    bwd = t[t.event == "backward"]
    for row in bwd.itertuples():
        ax.barh(0, (row.end - row.start) * 1e3, left=(row.start - origin) * 1e3, color="tab:blue", height=0.6)
    buckets = t[t.event == "bucket"].sort_values("bucket")
    for i, row in enumerate(buckets.itertuples(), start=1):
        ax.barh(i, (row.end - row.start) * 1e3, left=(row.start - origin) * 1e3, color="tab:orange", height=0.6)
    ax.axvline((float(upd.end.iloc[0]) - origin) * 1e3, color="k", lw=0.8, ls=":")
    ax.set_yticks(range(len(buckets) + 1), ["backward"] + [f"bucket {int(b)}" for b in buckets.bucket])
    ax.invert_yaxis()
    ax.set_xlabel("ms since the step started")
    ax.set_title(f"rank {rank}, step {step}: allreduces overlap backward", fontsize=9)


COLLECTIVE_COLOURS = {"reduce-scatter": "tab:orange", "allreduce": "tab:red", "all-gather": "tab:green",
                      "all-gather (just in time)": "tab:olive"}


def plot_zero_timeline(ax: Axes, trace: pd.DataFrame, step: int | None = None, rank: int = 0) -> None:
    """One rank's ZeRO step as a Gantt chart: backward, then each collective from its start to its end, in ms."""
    t = trace[trace.worker == rank]
    ups = t[t.event == "update"]
    if not len(ups):
        return
    step = int(ups.step.max()) if step is None else step
    t = t[t.step == step]
    upd = t[t.event == "update"]
    origin = float(upd.start.iloc[0])
    rows = [("backward", r.start, r.end, "tab:blue") for r in t[t.event == "backward"].itertuples()]
    rows += [(f"{r.what}, unit {int(r.unit)}", r.start, r.end, COLLECTIVE_COLOURS.get(r.what, "tab:gray"))
             for r in t[t.event == "collective"].sort_values("start").itertuples()]
    for i, (_, start, end, colour) in enumerate(rows):
        ax.barh(i, max((end - start) * 1e3, 0.05), left=(start - origin) * 1e3, color=colour, height=0.6)
    ax.axvline((float(upd.end.iloc[0]) - origin) * 1e3, color="k", lw=0.8, ls=":")
    ax.set_yticks(range(len(rows)), [name for name, *_ in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("ms since the step started (dotted: step done)")
    ax.set_title(f"ZeRO-{int(upd.stage.iloc[0])}, rank {rank}, step {step}", fontsize=9)


def plot_memory(ax: Axes, results: Mapping[str, pd.DataFrame]) -> None:
    """Bytes each rank held at the optimizer step, stacked by kind, with the formula as a black tick (MiB)."""
    for x, trace in enumerate(results.values()):
        ups = trace[trace.event == "update"]
        if not len(ups):  # a live trace before the first step
            continue
        ups = ups[ups.worker == ups.worker.min()]
        last = ups[ups.step == ups.step.max()].iloc[0]
        bottom = 0.0
        for col, name, color in PARTS:
            ax.bar(x, last[col] / 2**20, bottom=bottom, color=color, label=name if x == 0 else None)
            bottom += last[col] / 2**20
        ax.plot([x - 0.4, x + 0.4], [last.formula_total / 2**20] * 2, color="k", lw=2,
                label="Rajbhandari et al." if x == 0 else None)
    ax.set_xticks(range(len(results)), list(results))
    ax.set_ylabel("MiB per rank")
    ax.legend(fontsize=8)


def plot_zero_live(fig: Figure, trace: pd.DataFrame) -> None:
    """Panel plot for run_zero: memory held by kind against the formula (left), loss per step (right)."""
    fig.clear()
    ax_mem, ax_loss = fig.subplots(1, 2)
    ups = trace[trace.event == "update"] if len(trace) else trace
    if len(ups) and "held_params" in ups:
        plot_memory(ax_mem, {f"stage {int(ups.stage.iloc[0]) if 'stage' in ups else ''}": trace})
        first = ups[ups.worker == ups.worker.min()]
        ax_loss.plot(first.step, first.loss, marker=".")
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("training loss (rank 0's batch)")


def plot_ddp_live(fig: Figure, trace: pd.DataFrame) -> None:
    """Panel plot for run_ddp: the latest step's timeline (left), step time per step (right)."""
    fig.clear()
    ax_tl, ax_time = fig.subplots(1, 2)
    ups = trace[trace.event == "update"] if len(trace) else trace
    if len(ups):
        plot_timeline(ax_tl, trace, rank=int(ups.worker.min()))
        r0 = ups[ups.worker == ups.worker.min()]
        ax_time.plot(r0.step, r0.step_s * 1e3, marker=".")
    ax_time.set_xlabel("step")
    ax_time.set_ylabel("step time (ms)")
