"""Plots of the chapter, drawn from the trace only (so a panel can redraw them from a partial trace).

`plot_*(fig, trace)` draws into a given figure (widget panels); `show(result)` makes a new figure for a result.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from ..trace import Result
from .interop import VARIANTS, interop_table
from .intra import intra_table
from .lab import lab_table
from .oversub import oversub_table


def _cores(trace: pd.DataFrame) -> int | None:
    if "cores" in trace.columns and trace.cores.notna().any():
        return int(trace.cores.dropna().iloc[0])
    return None


def _waiting(fig: Figure, what: str) -> None:
    ax = fig.subplots()
    ax.text(0.5, 0.5, f"waiting for {what} measurements ...", ha="center", va="center", transform=ax.transAxes)
    ax.set_axis_off()


def plot_intra(fig: Figure, trace: pd.DataFrame) -> None:
    """Speedup over one thread against intra-op threads, one line per op, with the ideal line and the cores."""
    fig.clear()
    table = intra_table(trace)
    if not len(table):
        return _waiting(fig, "intra-op")
    ax = fig.subplots()
    top = int(table.threads.max())
    xs = np.arange(1, top + 1)
    ax.plot(xs, xs, "k--", lw=1, label="ideal (speedup = threads)")
    for op, rows in table.groupby("op"):
        ax.plot(rows.threads, rows.speedup, "o-", label=op)
    cores = _cores(trace)
    if cores is not None and cores < top:
        ax.axvline(cores, color="grey", lw=1, ls=":", label=f"{cores} cores")
    ax.set_xlabel("intra-op threads (torch.set_num_threads)")
    ax.set_ylabel("speedup over 1 thread")
    ax.set_xticks(xs)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()


def plot_interop(fig: Figure, trace: pd.DataFrame) -> None:
    """Two-tower time per forward for each schedule, grouped by inter-op pool size."""
    fig.clear()
    table = interop_table(trace)
    if not len(table):
        return _waiting(fig, "inter-op")
    ax = fig.subplots()
    sizes = sorted(table.interop_threads.unique())
    width = 0.8 / len(VARIANTS)
    for k, variant in enumerate(VARIANTS):
        rows = table[table.variant == variant].set_index("interop_threads").reindex(sizes)
        xs = np.arange(len(sizes)) + (k - (len(VARIANTS) - 1) / 2) * width
        ax.bar(xs, rows.seconds * 1e3, width, label=variant)
    ax.set_xticks(np.arange(len(sizes)), [str(s) for s in sizes])
    ax.set_xlabel("inter-op threads (torch.set_num_interop_threads)")
    ax.set_ylabel("ms per two-tower forward")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize="small")
    fig.tight_layout()


def plot_oversub(fig: Figure, trace: pd.DataFrame) -> None:
    """Throughput (vs one 1-thread process) against processes x threads, the ideal min(P T, cores) and the rule."""
    fig.clear()
    cores = _cores(trace) or 1
    table = oversub_table(trace, cores)
    if not len(table):
        return _waiting(fig, "oversubscription")
    ax = fig.subplots()
    top = int(table.total_threads.max())
    xs = np.arange(1, top + 1)
    ax.plot(xs, np.minimum(xs, cores), "k--", lw=1, label="ideal: min(P x T, cores)")
    for threads, rows in table.groupby("threads"):
        rows = rows.sort_values("total_threads")
        ax.plot(rows.total_threads, rows.throughput, "o-", label=f"T = {threads} thread(s) per process")
    rule = table[table.rule]
    ax.scatter(rule.total_threads, rule.throughput, s=160, facecolors="none", edgecolors="green",
               label="T = floor(cores / P)")
    ax.axvspan(cores + 0.5, top + 0.5, color="red", alpha=0.06, label="oversubscribed (P x T > cores)")
    for row in table.itertuples():
        ax.annotate(f"P={row.processes}", (row.total_threads, row.throughput), fontsize=7,
                    xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("total threads P x T")
    ax.set_ylabel("matmuls per second, relative")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()


def plot_lab(fig: Figure, trace: pd.DataFrame) -> None:
    """Baseline vs chosen setting: time of each workload (per process)."""
    fig.clear()
    table = lab_table(trace) if "workload" in trace.columns else pd.DataFrame()
    if not len(table):
        return _waiting(fig, "lab")
    ax = fig.subplots()
    labels = sorted(table.label.unique())
    for k, setting in enumerate(("baseline", "chosen")):
        rows = table[table.setting == setting].set_index("label").reindex(labels)
        xs = np.arange(len(labels)) + (k - 0.5) * 0.4
        ax.bar(xs, rows.seconds * 1e3, 0.4, label=setting)
    ax.set_xticks(np.arange(len(labels)), labels)
    ax.set_ylabel("ms per call (median, per process)")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize="small")
    fig.tight_layout()


def plot_streams(fig: Figure, trace: pd.DataFrame) -> None:
    """Default stream vs one stream per chain (or a note that the worker has no GPU)."""
    fig.clear()
    ax = fig.subplots()
    if "seconds" not in trace.columns or not trace.seconds.notna().any():
        ax.text(0.5, 0.5, "no GPU measurements (no CUDA device on the worker)", ha="center", va="center",
                transform=ax.transAxes)
        ax.set_axis_off()
        return
    rows = trace[trace.seconds.notna()]
    ax.bar(rows.variant, rows.seconds * 1e3)
    ax.set_ylabel("ms for all chains")
    fig.tight_layout()


PLOTS = {
    "IntraOpConfig": plot_intra,
    "InterOpConfig": plot_interop,
    "OversubConfig": plot_oversub,
    "ThreadsLabConfig": plot_lab,
    "StreamsConfig": plot_streams,
}


def show(result: Result, figsize: tuple[float, float] = (7, 3.6)) -> Figure:
    """A new figure with the default plot for this result's experiment."""
    fig = plt.figure(figsize=figsize)
    PLOTS[type(result.config).__name__](fig, result.trace)
    return fig
