"""Plots that read the event trace: loss against wall-clock time and against updates, for one run or several."""

from __future__ import annotations

from collections.abc import Mapping

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure

from .trace import Result


def loss_points(trace: pd.DataFrame) -> pd.DataFrame:
    """The rows to draw a loss curve from: evaluations when the run made them, else every update."""
    if not len(trace):
        return trace
    evals = trace[(trace.event == "eval") & trace.loss.notna()]
    rows = evals if len(evals) else trace[(trace.event == "update") & trace.loss.notna()]
    rows = rows.copy()
    rows["updates"] = rows["version_applied"].where(rows["version_applied"] >= 0, rows["step"] + 1)
    return rows


def draw_loss(fig: Figure, traces: Mapping[str, pd.DataFrame], title: str | None = None) -> Figure:
    """Draw loss vs wall time (left) and vs updates (right) for each labelled trace into fig (cleared first)."""
    fig.clear()
    ax_time, ax_updates = fig.subplots(1, 2)
    for label, trace in traces.items():
        pts = loss_points(trace)
        if not len(pts):
            continue
        marker = "o" if len(pts) < 3 else None  # a line through one point is invisible
        ax_time.plot(pts["time"], pts["loss"], label=label, lw=1.5, marker=marker)
        ax_updates.plot(pts["updates"], pts["loss"], label=label, lw=1.5, marker=marker)
    ax_time.set_xlabel("wall-clock time (s)")
    ax_updates.set_xlabel("updates applied")
    for ax in (ax_time, ax_updates):
        ax.set_ylabel("training loss")
        ax.grid(alpha=0.3)
    if len(traces) > 1 or (traces and next(iter(traces)) != "run"):
        ax_updates.legend(fontsize="small", loc="upper right")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_live(fig: Figure, trace: pd.DataFrame) -> None:
    """Default live plot of a widget panel: the current run's loss curves."""
    draw_loss(fig, {"run": trace})


def compare(results: Mapping[str, Result], title: str | None = None, figsize: tuple[float, float] = (10, 3.6)) -> Figure:
    """A new figure comparing several runs' loss curves, labelled by the mapping's keys."""
    fig = plt.figure(figsize=figsize)
    return draw_loss(fig, {label: r.trace for label, r in results.items()}, title)
