"""Plots of this chapter, all drawn from traces: step times, loss vs wall clock, staleness, worker timelines."""

from __future__ import annotations

from collections.abc import Mapping

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from ..plots import loss_points
from ..trace import Result

#: Timeline colours: one per kind of time a worker spends.
COLOURS = {
    "compute": "tab:blue",
    "injected delay": "tab:orange",
    "communicating": "tab:green",
    "waiting": "lightgrey",
    "discarded": "tab:red",
}


def step_times(trace: pd.DataFrame) -> np.ndarray:
    """Seconds per synchronous step (time between consecutive versions), the start-up step left out."""
    if "step_s" not in trace.columns:
        return np.array([])
    rows = trace[(trace.event == "update") & trace.step_s.notna()]
    return rows.sort_values("step").step_s.to_numpy()[1:] if len(rows) else np.array([])


def plot_step_times(ax: Axes, results: Mapping[str, Result]) -> Axes:
    """Histograms of step time (ms) per run: backups cut the tail that stragglers add to the barrier."""
    all_ms = [step_times(r.trace) * 1e3 for r in results.values()]
    hi = max((float(np.quantile(ms, 0.99)) for ms in all_ms if ms.size), default=1.0)
    bins = np.linspace(0, hi * 1.05, 40)
    for (label, _), ms in zip(results.items(), all_ms, strict=True):
        if ms.size:
            ax.hist(np.clip(ms, 0, bins[-1]), bins=bins, alpha=0.55, label=f"{label} (mean {ms.mean():.0f} ms)")
    ax.set_xlabel("step time (ms; the last bin collects the tail)")
    ax.set_ylabel("steps")
    ax.legend(fontsize="small")
    return ax


def plot_loss_vs_time(ax: Axes, results: Mapping[str, Result]) -> Axes:
    """Training loss against wall-clock seconds for each run (driver-side evaluations)."""
    for label, result in results.items():
        pts = loss_points(result.trace)
        if len(pts):
            ax.plot(pts.time, pts.loss, marker=".", label=label)
    ax.set_xlabel("wall-clock time (s)")
    ax.set_ylabel("training loss")
    ax.legend(fontsize="small")
    return ax


def plot_staleness(ax: Axes, result: Result) -> Axes:
    """Histogram of gradient staleness in an asynchronous run, with its mean and the N-1 reference."""
    pushes = result.trace[result.trace.event == "push"]
    if not len(pushes):
        ax.text(0.5, 0.5, "no asynchronous pushes yet", ha="center", transform=ax.transAxes)
        return ax
    s = pushes.staleness.astype(int)
    ax.hist(s, bins=np.arange(s.max() + 2) - 0.5, rwidth=0.85, color="tab:purple")
    ax.axvline(s.mean(), color="k", ls="--", label=f"mean {s.mean():.2f}")
    workers = getattr(result.config, "workers", None)
    if workers:
        ax.axvline(workers - 1, color="tab:red", ls=":", label=f"N - 1 = {workers - 1}")
    ax.set_xlabel("staleness (updates between read and write)")
    ax.set_ylabel("gradients")
    ax.legend(fontsize="small")
    return ax


def timeline_segments(trace: pd.DataFrame) -> pd.DataFrame:
    """One row per (worker, kind, start, duration) from the per-gradient events that carry timings."""
    out: list[tuple[int, str, float, float]] = []
    if "t_begin" not in trace.columns:
        return pd.DataFrame(out, columns=["worker", "kind", "start", "duration"])
    rows = trace[trace.event.isin(["gradient", "discarded", "cancelled", "push"]) & trace.t_begin.notna()]
    for ev in rows.itertuples():
        start, wasted = float(ev.t_begin), ev.event in ("discarded", "cancelled")
        for kind, dur in (
            ("compute", ev.compute_s),
            ("injected delay", ev.injected_delay),
            ("communicating", ev.comm_s),
            ("waiting", ev.wait_s),
        ):
            dur = float(dur) if pd.notna(dur) else 0.0
            if dur > 0:
                shown = "discarded" if wasted and kind in ("compute", "injected delay") else kind
                out.append((int(ev.worker), shown, start, dur))
                start += dur
    return pd.DataFrame(out, columns=["worker", "kind", "start", "duration"])


def plot_timeline(ax: Axes, result: Result, window_s: float | None = None) -> Axes:
    """Per-worker timeline: compute, injected delay, communicating, waiting; work thrown away in red."""
    seg = timeline_segments(result.trace)
    if window_s is not None and len(seg):
        seg = seg[seg.start < seg.start.min() + window_s]
    for (worker, kind), grp in seg.groupby(["worker", "kind"]):
        ax.broken_barh(list(zip(grp.start, grp.duration, strict=True)), (worker - 0.4, 0.8), color=COLOURS[kind])
    workers = sorted(seg.worker.unique()) if len(seg) else []
    ax.set_yticks(workers, [f"worker {w}" for w in workers])
    ax.set_xlabel("wall-clock time (s)")
    ax.legend(handles=[Patch(color=c, label=k) for k, c in COLOURS.items()], fontsize="small", ncol=5,
              loc="upper center", bbox_to_anchor=(0.5, -0.25))
    return ax


def plot_bytes(ax: Axes, results: Mapping[str, Result]) -> Axes:
    """Gradient bytes sent to the server per run (uplink): what 1-bit SGD saves."""
    labels = list(results)
    values = [r.summary.get("uplink_bytes", r.summary.get("bytes_sent", 0)) / 1e3 for r in results.values()]
    ax.bar(labels, values, color="tab:cyan")
    ax.set_ylabel("gradient kB sent")
    ax.tick_params(axis="x", labelrotation=15)
    return ax


def plot_live(fig: Figure, trace: pd.DataFrame) -> None:
    """Live panel plot: loss vs wall clock, and step times (sync) or staleness (async) of the current run."""
    fig.clear()
    left, right = fig.subplots(1, 2)
    pts = loss_points(trace)
    if len(pts):
        left.plot(pts.time, pts.loss, marker=".")
    left.set_xlabel("wall-clock time (s)")
    left.set_ylabel("training loss")
    if len(trace) and (trace.event == "push").any():
        plot_staleness(right, Result(None, trace))
    else:
        ms = step_times(trace) * 1e3 if len(trace) else np.array([])
        if ms.size:
            right.hist(ms, bins=30, color="tab:blue")
        right.set_xlabel("step time (ms)")
        right.set_ylabel("steps")
    fig.tight_layout()


def overview(results: Mapping[str, Result], figsize: tuple[float, float] = (11, 3.6)) -> Figure:
    """A new figure: loss vs wall clock for several runs, next to the step-time histograms of the sync ones."""
    fig, (a, b) = plt.subplots(1, 2, figsize=figsize)
    plot_loss_vs_time(a, results)
    sync = {k: r for k, r in results.items() if len(step_times(r.trace))}
    if sync:
        plot_step_times(b, sync)
    fig.tight_layout()
    return fig
