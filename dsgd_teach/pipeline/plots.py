"""Figures drawn from a pipeline run's trace: the timeline, the bubble against theory, activations held, losses."""

from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.axes import Axes

from .schedules import ideal_bubble

COLORS = {"forward": "#4C9BE8", "backward": "#E8884C", "idle": "#DDDDDD"}


def pick_step(trace: pd.DataFrame) -> int:
    """The step a timeline shows: the second one when there is one (the first pays for warming up)."""
    steps = sorted(trace[trace.event == "forward"].step.unique())
    return int(steps[1] if len(steps) > 1 else steps[0]) if steps else 0


def plot_timeline(ax: Axes, trace: pd.DataFrame, step: int | None = None, label: bool = True) -> None:
    """One row per stage (stage 0 on top, as in the GPipe paper): forward and backward bars with microbatch ids.

    In emulated-devices mode (the trace has `injected_s`), each bar's measured computation is drawn solid and the
    injected sleep of the emulated device hatched, so the picture never passes the sleep off as work.
    """
    step = pick_step(trace) if step is None else step
    work = trace[(trace.step == step) & trace.event.isin(["forward", "backward"])]
    if not len(work):
        ax.set_title("no work recorded yet")
        return
    t0 = work.t_start.min()
    stages = int(trace.worker.max()) + 1
    emulated = "injected_s" in work and bool((work.injected_s.fillna(0) > 0).any())
    for row in work.itertuples():
        y = stages - 1 - row.worker
        left, width = (row.t_start - t0) * 1e3, row.duration * 1e3
        if emulated:
            solid = min(width, max(0.0, float(row.compute_s) * 1e3))
            ax.broken_barh([(left, solid)], (y - 0.4, 0.8), color=COLORS[row.event], edgecolor="white",
                           linewidth=0.5)
            ax.broken_barh([(left + solid, width - solid)], (y - 0.4, 0.8), facecolor=COLORS[row.event],
                           alpha=0.45, hatch="///", edgecolor="white", linewidth=0.5)
        else:
            ax.broken_barh([(left, width)], (y - 0.4, 0.8), color=COLORS[row.event], edgecolor="white",
                           linewidth=0.5)
        if label and width > 0:
            ax.text(left + width / 2, y, str(int(row.microbatch)), ha="center", va="center", fontsize=7)
    ax.set_yticks(range(stages), [f"stage {stages - 1 - y}" for y in range(stages)])
    ax.set_xlabel(f"time in step {step} (ms)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLORS[k]) for k in ("forward", "backward")]
    names = ["forward", "backward"]
    if emulated:
        handles.append(plt.Rectangle((0, 0), 1, 1, facecolor="white", edgecolor="grey", hatch="///"))
        names.append("injected (emulated device)")
    ax.legend(handles, names, loc="upper right", fontsize=7)


def plot_bubble(ax: Axes, table: pd.DataFrame, mode: str | None = None) -> None:
    """Measured idle fraction against microbatches, with (p-1)/(m+p-1) for each number of stages.

    mode: which mode measured the points ("real compute" or the emulated devices'), written in the title.
    """
    if mode:
        ax.set_title(mode, fontsize=9)
    for p, rows in table.groupby("stages"):
        rows = rows.sort_values("microbatches")
        line = ax.plot(rows.microbatches, rows.bubble, "o", label=f"measured, p={p}")[0]
        if "waiting" in rows:  # the part spent waiting; the gap up to the dot is per-message overhead
            ax.plot(rows.microbatches, rows.waiting, "x", color=line.get_color(), label=f"of it waiting, p={p}")
        m = np.arange(1, int(rows.microbatches.max()) + 1)
        ax.plot(m, [ideal_bubble(int(p), int(k)) for k in m], "-", color=line.get_color(), alpha=0.6,
                label=f"(p-1)/(m+p-1), p={p}")
    ax.set_xlabel("microbatches m")
    ax.set_ylabel("bubble (idle fraction of the step)")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7)


def held_over_time(trace: pd.DataFrame) -> pd.DataFrame:
    """Activations held by each stage after each forward or backward, in time order."""
    work = trace[trace.event.isin(["forward", "backward"])].sort_values("time")
    return work[["worker", "step", "time", "held", "event", "microbatch"]]


def plot_held(ax: Axes, results: dict[str, Any]) -> None:
    """Most microbatches of activations each stage held, one bar group per schedule (from the traces)."""
    names = list(results)
    width = 0.8 / max(1, len(names))
    for i, name in enumerate(names):
        held = held_over_time(results[name].trace).groupby("worker").held.max()
        ax.bar(held.index + i * width, held.to_numpy(), width, label=name)
        stages = held.index
    if names:
        ax.set_xticks(stages + width * (len(names) - 1) / 2, [str(s) for s in stages])
    ax.set_xlabel("stage")
    ax.set_ylabel("activations held (microbatches)")
    ax.legend(fontsize=7)


def plot_losses(ax: Axes, results: dict[str, Any]) -> None:
    """Training loss per step of several runs on the same batches."""
    for name, result in results.items():
        up = result.trace[result.trace.event == "update"].sort_values("step")
        ax.plot(up.step, up.loss, label=name)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (batch)")
    ax.legend(fontsize=7)


def plot_pipeline_live(fig: plt.Figure, trace: pd.DataFrame) -> None:
    """The panel's figure: the timeline of the latest complete step and the loss so far."""
    fig.clear()
    ax1, ax2 = fig.subplots(1, 2, gridspec_kw={"width_ratios": [2, 1]})
    if len(trace) and (trace.event == "forward").any():
        steps = sorted(trace[trace.event == "forward"].step.unique())
        plot_timeline(ax1, trace, int(steps[-2] if len(steps) > 1 else steps[-1]))
        emulated = "injected_s" in trace and bool((trace.injected_s.fillna(0) > 0).any())
        ax1.set_title("emulated devices (hatched: injected time)" if emulated else "real compute", fontsize=9)
        up = trace[trace.event == "update"].sort_values("step")
        ax2.plot(up.step, up.loss)
    ax2.set_xlabel("step")
    ax2.set_ylabel("loss")
    fig.tight_layout()
