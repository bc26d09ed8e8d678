"""Chapter 03 plots, all read from the trace: staleness histogram, per-shard traffic, and a live panel view."""

from __future__ import annotations

from collections.abc import Mapping

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from ..plots import loss_points
from ..trace import Result


def applied_pushes(trace: pd.DataFrame) -> pd.DataFrame:
    """Push rows a shard actually applied (duplicates left out)."""
    if "shard" not in trace.columns or not len(trace):
        return trace.iloc[0:0]
    pushes = trace[trace.event == "push"]
    if "applied" in pushes.columns:
        pushes = pushes[pushes.applied.fillna(True).astype(bool)]
    return pushes


def plot_staleness(traces: Mapping[str, pd.DataFrame], ax: Axes | None = None) -> Axes:
    """Histogram of staleness (updates by others between read and apply) over every applied push, per run."""
    ax = ax or plt.figure(figsize=(5, 3.2)).subplots()
    labelled = {k: applied_pushes(t).staleness.to_numpy(dtype=int) for k, t in traces.items()}
    labelled = {k: v for k, v in labelled.items() if len(v)}
    top = max((int(v.max()) for v in labelled.values()), default=0)
    bins = np.arange(min(0, *(int(v.min()) for v in labelled.values())) if labelled else 0, top + 2) - 0.5
    for label, values in labelled.items():
        ax.hist(values, bins=bins, alpha=0.55, label=f"{label} (mean {values.mean():.2f})", density=True)
    if labelled:  # a rare long delay would squash the histogram: show up to the 99.5th percentile
        q = max(float(np.percentile(v, 99.5)) for v in labelled.values())
        ax.set_xlim(bins[0], max(q, 1) + 1.5)
    ax.set_xlabel("staleness of an applied push (updates in between)")
    ax.set_ylabel("fraction of pushes")
    if labelled:
        ax.legend(fontsize="small")
    ax.grid(alpha=0.3)
    return ax


def shard_traffic(trace: pd.DataFrame) -> pd.DataFrame:
    """Megabytes pushed to and fetched from each shard (rows: shard; columns: push, fetch)."""
    if "shard" not in trace.columns:
        return pd.DataFrame(columns=["push", "fetch"])
    rows = trace[trace.event.isin(["push", "fetch"]) & trace.shard.notna()]
    table = rows.pivot_table(index="shard", columns="event", values="bytes_sent", aggfunc="sum", fill_value=0)
    table = table.reindex(columns=["push", "fetch"], fill_value=0) / 1e6
    table.index = table.index.astype(int)
    return table


def plot_shard_traffic(trace: pd.DataFrame, ax: Axes | None = None) -> Axes:
    """Bar chart of the megabytes each shard received (pushes) and sent (fetches)."""
    ax = ax or plt.figure(figsize=(5, 3.2)).subplots()
    table = shard_traffic(trace)
    x = np.arange(len(table))
    ax.bar(x - 0.2, table["push"], width=0.4, label="pushed to shard")
    ax.bar(x + 0.2, table["fetch"], width=0.4, label="fetched from shard")
    ax.set_xticks(x, [f"shard {s}" for s in table.index])
    ax.set_ylabel("MB")
    ax.legend(fontsize="small")
    ax.grid(alpha=0.3, axis="y")
    return ax


def plot_ps_live(fig: Figure, trace: pd.DataFrame) -> None:
    """The widget panel's live view: loss vs time, staleness histogram, per-shard traffic."""
    fig.clear()
    ax_loss, ax_stale, ax_traffic = fig.subplots(1, 3)
    pts = loss_points(trace)
    if len(pts):
        ax_loss.plot(pts["time"], pts["loss"], marker=".", lw=1.2)
    ax_loss.set_xlabel("wall-clock time (s)")
    ax_loss.set_ylabel("training loss")
    ax_loss.grid(alpha=0.3)
    plot_staleness({"run": trace}, ax_stale)
    ax_stale.set_xlabel("staleness")
    plot_shard_traffic(trace, ax_traffic)
    fig.tight_layout()


def plot_result(result: Result) -> Figure:
    """One run's overview (what the CLI and the registry show): the live view, drawn once."""
    fig = plt.figure(figsize=(11, 3.4))
    plot_ps_live(fig, result.trace)
    return fig


def plot_overview(results: Mapping[str, Result], figsize: tuple[float, float] = (11, 3.4)) -> Figure:
    """Staleness histograms of several runs side by side with the first asynchronous run's shard traffic."""
    fig = plt.figure(figsize=figsize)
    ax_stale, ax_traffic = fig.subplots(1, 2)
    plot_staleness({k: r.trace for k, r in results.items()}, ax_stale)
    with_shards = [(k, r) for k, r in results.items() if "shard" in r.trace.columns]
    if with_shards:
        label, result = with_shards[-1]
        plot_shard_traffic(result.trace, ax_traffic)
        ax_traffic.set_title(f"traffic per shard: {label}", fontsize="medium")
    fig.tight_layout()
    return fig
