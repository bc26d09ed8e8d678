"""Chapter 10's figures, drawn from a run's trace or a ranking table: loss, bytes per axis, experts' load, layouts."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from .mesh import AXES


def plot_loss(ax: Axes, trace: pd.DataFrame) -> None:
    """The step's loss (the last stage's ranks report it) against the step."""
    ups = trace[(trace.event == "update")].dropna(subset=["loss"]) if len(trace) else trace
    if len(ups):
        loss = ups.groupby("step").loss.first()
        ax.plot(loss.index, loss.values, marker=".")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")


def plot_bytes(ax: Axes, trace: pd.DataFrame) -> None:
    """Bytes the busiest rank sent on each mesh axis in a step (median over steps)."""
    ups = trace[trace.event == "update"] if len(trace) else trace
    cols = [f"bytes_{a}" for a in AXES]
    if len(ups) and all(c in ups.columns for c in cols):
        per = [float(ups.groupby("step")[c].max().median()) for c in cols]
        ax.bar(AXES, per, color="tab:blue")
    ax.set_ylabel("bytes per step (busiest rank)")


def plot_experts(ax: Axes, trace: pd.DataFrame) -> None:
    """Tokens routed to each expert and tokens dropped, summed over layers and ranks, in the latest step."""
    rows = trace[trace.event == "routing"] if len(trace) else trace
    if not len(rows) or "tokens_per_expert" not in rows.columns:
        ax.text(0.5, 0.5, "dense MLP: no experts", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return
    last = rows[rows.step == rows.step.max()]
    routed = np.sum([np.asarray(t) for t in last.tokens_per_expert], axis=0)
    kept = np.sum([np.asarray(t) for t in last.kept_per_expert], axis=0)
    experts = np.arange(len(routed))
    ax.bar(experts, kept, color="tab:green", label="kept")
    ax.bar(experts, routed - kept, bottom=kept, color="tab:red", label="dropped (over capacity)")
    ax.set_xlabel("expert")
    ax.set_ylabel("tokens, latest step")
    ax.set_title(f"dropped: {int(last.dropped.sum())} of {int(routed.sum())} assignments", fontsize=9)
    ax.legend(fontsize=8)


def plot_run_live(fig: Figure, trace: pd.DataFrame) -> None:
    """The run panel's figure: loss, bytes per axis, and the experts' load (or the step time without experts)."""
    fig.clear()
    ax_loss, ax_bytes, ax_exp = fig.subplots(1, 3)
    plot_loss(ax_loss, trace)
    plot_bytes(ax_bytes, trace)
    plot_experts(ax_exp, trace)
    fig.tight_layout()


def plot_ranking(ax: Axes, table: pd.DataFrame, top: int = 12) -> None:
    """Predicted step time of the fastest `top` layouts, compute and communication stacked; grey if it does not fit."""
    rows = table.head(top).iloc[::-1]
    comm = rows[[c for c in rows.columns if c.endswith("_s") and c not in ("compute_s", "bubble_s", "step_s")]]
    y = np.arange(len(rows))
    ax.barh(y, rows.compute_s * 1e3, color="tab:blue", label="compute")
    ax.barh(y, rows.bubble_s * 1e3, left=rows.compute_s * 1e3, color="tab:orange", label="pipeline bubble")
    ax.barh(y, comm.sum(axis=1) * 1e3, left=(rows.compute_s + rows.bubble_s) * 1e3, color="tab:red",
            label="messages")
    ax.set_yticks(y, [f"{name}{'' if fits else ' (does not fit)'}" for name, fits in zip(rows.layout, rows.fits,
                                                                                         strict=True)])
    ax.set_xlabel("predicted step time (ms)")
    ax.legend(fontsize=8)


def plot_predicted_vs_measured(ax: Axes, table: pd.DataFrame) -> None:
    """Predicted over measured for each quantity of one or more runs (1 is a perfect prediction)."""
    ax.axhspan(0.75, 1.25, color="0.9", label="±25 %")
    ax.axhline(1.0, color="k", lw=0.8)
    labels = table["run"] + ": " + table.quantity if "run" in table.columns else table.quantity
    ax.scatter(np.arange(len(table)), table.ratio, zorder=3)
    ax.set_xticks(np.arange(len(table)), labels, rotation=70, ha="right", fontsize=7)
    ax.set_ylabel("predicted / measured")
    ax.legend(fontsize=8)
