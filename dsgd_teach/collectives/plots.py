"""Plots that read the allreduce traces: bytes per link, time per repeat, time against size and against N."""

from __future__ import annotations

from collections.abc import Mapping

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from ..trace import Result
from .cost_model import AlphaBeta, predict_seconds

COLORS = {"naive": "tab:red", "doubling": "tab:orange", "tree": "tab:orange", "binomial": "tab:green",
          "halving-doubling": "tab:purple", "ring": "tab:blue", "library": "tab:gray"}


def link_matrix(trace: pd.DataFrame) -> np.ndarray:
    """bytes[src, dst] sent over each link during one allreduce (the message events of the trace)."""
    msgs = trace[trace.event == "message"] if len(trace) else trace
    n = int(max(msgs.worker.max(), msgs.peer.max()) + 1) if len(msgs) else 1
    out = np.zeros((n, n))
    for row in msgs.itertuples():
        out[int(row.worker), int(row.peer)] += row.bytes_sent
    return out


def plot_links(ax: Axes, trace: pd.DataFrame, title: str = "") -> None:
    """Heat map of bytes per link (row: sender, column: receiver), annotated."""
    mat = link_matrix(trace)
    ax.imshow(mat, cmap="Blues")
    for (i, j), v in np.ndenumerate(mat):
        if v:
            ax.text(j, i, _human(v), ha="center", va="center", fontsize=7,
                    color="white" if v > 0.6 * mat.max() else "black")
    ax.set_xticks(range(len(mat)))
    ax.set_yticks(range(len(mat)))
    ax.set_xlabel("receiver rank")
    ax.set_ylabel("sender rank")
    ax.set_title(title or "bytes per link, one allreduce", fontsize=9)


def plot_allreduce_live(fig: Figure, trace: pd.DataFrame) -> None:
    """Panel plot for run_allreduce: bytes per link (left) and time of each repeat (right)."""
    fig.clear()
    ax_links, ax_time = fig.subplots(1, 2)
    if len(trace) and (trace.event == "message").any():
        plot_links(ax_links, trace)
    else:
        ax_links.set_title("no messages logged (library allreduce or one rank)", fontsize=9)
        ax_links.axis("off")
    timed = trace[(trace.event == "allreduce") & (trace.worker == 0)] if len(trace) else trace
    if len(timed):
        ax_time.bar(timed.step, timed.slowest_seconds * 1e3, color=COLORS.get(timed.algorithm.iloc[0], "tab:blue"))
    ax_time.xaxis.set_major_locator(MaxNLocator(integer=True))  # repeats are whole numbers
    ax_time.set_xlabel("repeat")
    ax_time.set_ylabel("time of slowest rank (ms)")
    ax_time.grid(alpha=0.3)
    fig.tight_layout()


def _human(nbytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if nbytes < 1024 or unit == "GiB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    return str(nbytes)


def median_times(trace: pd.DataFrame) -> pd.DataFrame:
    """Median time of the slowest rank per (algorithm, nbytes), from the allreduce events of rank 0."""
    timed = trace[(trace.event == "allreduce") & (trace.worker == 0)]
    return timed.groupby(["algorithm", "nbytes"], as_index=False).slowest_seconds.median()


def plot_sweep(ax: Axes, result: Result) -> None:
    """Time against message size (log-log): measured points and the alpha-beta prediction as dashed lines."""
    med = median_times(result.trace)
    summary = result.summary
    model = AlphaBeta(summary["alpha_us"] * 1e-6, summary["beta"]) if "beta" in summary else None
    for algorithm, rows in med.groupby("algorithm"):
        color = COLORS.get(algorithm)
        ax.loglog(rows.nbytes, rows.slowest_seconds * 1e3, "o-", color=color, label=algorithm, ms=4)
        if model is not None and algorithm != "library":
            pred = [predict_seconds(model, algorithm, result.config.workers, int(b) // 4) * 1e3 for b in rows.nbytes]
            ax.loglog(rows.nbytes, pred, "--", color=color, alpha=0.7)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("allreduce time (ms)")
    ax.set_title(f"{result.config.workers} ranks (solid: measured, dashed: alpha-beta)", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)


def plot_time_vs_workers(ax: Axes, sweeps: Mapping[int, Result], nbytes: int) -> None:
    """Time at one message size against the number of ranks, measured (solid) and predicted (dashed)."""
    rows = []
    for n, result in sorted(sweeps.items()):
        med = median_times(result.trace)
        med = med[med.nbytes == nbytes]
        s = result.summary
        model = AlphaBeta(s["alpha_us"] * 1e-6, s["beta"]) if "beta" in s else None
        for r in med.itertuples():
            pred = predict_seconds(model, r.algorithm, n, nbytes // 4) if model and r.algorithm != "library" else np.nan
            rows.append({"n": n, "algorithm": r.algorithm, "measured": r.slowest_seconds, "predicted": pred})
    df = pd.DataFrame(rows)
    for algorithm, part in df.groupby("algorithm") if len(df) else []:
        color = COLORS.get(algorithm)
        ax.plot(part.n, part.measured * 1e3, "o-", color=color, label=algorithm)
        if part.predicted.notna().any():
            ax.plot(part.n, part.predicted * 1e3, "--", color=color, alpha=0.7)
    ax.set_xticks(sorted(sweeps))
    ax.set_xlabel("ranks N")
    ax.set_ylabel("allreduce time (ms)")
    ax.set_title(f"{_human(nbytes)} per rank (solid: measured, dashed: alpha-beta)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def plot_bytes_per_step(ax: Axes, messages: pd.DataFrame, algorithm: str) -> None:
    """Bytes each rank sends in each communication step of one algorithm (from a messages DataFrame)."""
    sent = messages[(messages.direction == "send") & (messages.algorithm == algorithm)]
    table = sent.pivot_table(index="step", columns="rank", values="bytes", aggfunc="sum", fill_value=0)
    table.plot.bar(ax=ax, width=0.8)
    ax.set_ylabel("bytes sent")
    ax.set_title(f"{algorithm}: bytes per rank per step", fontsize=9)


def compare_links(results: Mapping[str, Result], figsize: tuple[float, float] = (10, 3.2)) -> Figure:
    """Side-by-side bytes-per-link heat maps for several runs (e.g. naive, doubling, ring)."""
    fig, axes = plt.subplots(1, len(results), figsize=figsize)
    for ax, (label, result) in zip(np.atleast_1d(axes), results.items(), strict=True):
        plot_links(ax, result.trace, title=label)
    fig.tight_layout()
    return fig
