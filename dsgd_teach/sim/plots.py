"""Plots of simulated runs that read the trace (or the papers' tables), plus the calibration plot."""

from __future__ import annotations

from collections.abc import Mapping

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from ..plots import draw_loss, loss_points
from ..trace import Result


def step_times_ms(trace: pd.DataFrame) -> np.ndarray:
    """Milliseconds per synchronous step (all steps but the first) from a sync trace."""
    rows = trace[(trace.event == "update") & (trace.worker == -1)]
    if "step_s" not in rows or not len(rows):
        return np.array([])
    return rows.sort_values("step").step_s.to_numpy(dtype=float)[1:] * 1e3


def plot_step_times(results: Mapping[str, Result], figsize: tuple[float, float] = (7, 3.4)) -> Figure:
    """Histogram of step times for each labelled sync run (e.g. 100 sync vs 96 + 4 backups)."""
    fig, ax = plt.subplots(figsize=figsize)
    all_ms = np.concatenate([step_times_ms(r.trace) for r in results.values()] + [np.array([])])
    all_ms = all_ms[all_ms > 0]
    bins = np.geomspace(all_ms.min() * 0.99, all_ms.max() * 1.01, 40) if all_ms.size else 10
    for label, result in results.items():
        ms = step_times_ms(result.trace)
        ax.hist(ms, bins=bins, alpha=0.55, label=f"{label} (mean {ms.mean():.0f} ms)")
    ax.set_xscale("log")
    ax.set_xlabel("step time (ms, simulated)")
    ax.set_ylabel("steps")
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def plot_staleness_vs_workers(table: pd.DataFrame, figsize: tuple[float, float] = (5.5, 3.6)) -> Figure:
    """Mean staleness against the number of async workers, with the line N - 1."""
    fig, ax = plt.subplots(figsize=figsize)
    ax.plot(table.workers, table.mean_staleness, "o-", label="simulated mean staleness")
    ax.plot(table.workers, table.n_minus_1, "k--", lw=1, label="N - 1")
    ax.set_xscale("symlog")
    ax.set_yscale("symlog")
    ax.set_xlabel("asynchronous workers N")
    ax.set_ylabel("mean staleness (updates)")
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def plot_allreduce_vs_workers(table: pd.DataFrame, figsize: tuple[float, float] = (5.5, 3.6)) -> Figure:
    """Allreduce time against N for each algorithm (log-log): the central server's grows, the ring's stays."""
    fig, ax = plt.subplots(figsize=figsize)
    for algorithm, rows in table.groupby("algorithm"):
        label = {"naive": "central server (naive)", "doubling": "recursive doubling (butterfly)"}.get(algorithm, algorithm)
        ax.loglog(rows.workers, rows.seconds, "o-", label=label)
    ax.set_xlabel("workers N")
    ax.set_ylabel("seconds per allreduce (simulated)")
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def plot_calibration(table: pd.DataFrame, figsize: tuple[float, float] = (9, 3.4)) -> Figure:
    """Real vs simulated step-time distributions per N (left) and the median ratio with the 20% band (right)."""
    fig, (ax_box, ax_ratio) = plt.subplots(1, 2, figsize=figsize, gridspec_kw={"width_ratios": [2, 1]})
    samples = table.attrs.get("samples", {})
    data, labels, colors = [], [], []
    for n in table.n:
        for kind, color in (("real", "tab:blue"), ("sim", "tab:orange")):
            data.append(np.asarray(samples.get(n, {}).get(kind, []), dtype=float) * 1e3)
            labels.append(f"{n}\n{kind}")
            colors.append(color)
    parts = ax_box.boxplot(data, patch_artist=True)
    ax_box.set_xticks(range(1, len(labels) + 1), labels, fontsize=7)
    for patch, color in zip(parts["boxes"], colors, strict=True):
        patch.set_facecolor(color)
        patch.set_alpha(0.5)
    ax_box.set_ylabel("step time (ms)")
    ax_box.set_title("real cluster vs simulator, per N", fontsize=9)
    ax_ratio.axhspan(0.8, 1.2, color="tab:green", alpha=0.15, label="within 20%")
    ax_ratio.plot(table.n, table.ratio, "o-")
    ax_ratio.axhline(1.0, color="k", lw=0.8)
    ax_ratio.set_xlabel("workers N")
    ax_ratio.set_ylabel("median sim / median real")
    ax_ratio.legend(fontsize="small")
    fig.tight_layout()
    return fig


def plot_sim_live(fig: Figure, trace: pd.DataFrame) -> None:
    """Widget-panel plot for simulated runs: the loss (real mode) or step times / staleness (timing mode)."""
    if len(trace) and len(loss_points(trace)):
        draw_loss(fig, {"simulated": trace})
        return
    fig.clear()
    ax = fig.subplots()
    if len(trace) and (trace.event == "push").any():
        stale = trace[trace.event == "push"].staleness
        ax.hist(stale, bins=min(50, int(stale.max()) + 1))
        ax.set_xlabel(f"staleness (mean {stale.mean():.1f})")
        ax.set_ylabel("gradients")
    elif len(trace) and (trace.event == "allreduce").any():
        rows = trace[trace.event == "allreduce"]
        ax.plot(rows.step, rows.slowest_seconds * 1e3, "o")
        ax.set_xlabel("repeat")
        ax.set_ylabel("allreduce time (ms)")
    else:
        ms = step_times_ms(trace)
        if ms.size:
            ax.hist(ms, bins=30)
            ax.set_xlabel(f"step time (ms; mean {ms.mean():.1f})")
            ax.set_ylabel("steps")
    fig.tight_layout()


def plot_result(result: Result, figsize: tuple[float, float] = (9, 3.4)) -> Figure:
    """A new figure of one simulated run (what `dsgd-teach run simulated` saves)."""
    fig = plt.figure(figsize=figsize)
    plot_sim_live(fig, result.trace)
    return fig


def plot_sharded_at_scale(table: pd.DataFrame, gpu_gib: float = 80.0,
                          figsize: tuple[float, float] = (10, 3.6)) -> Figure:
    """sim.sharded's sweep: memory per GPU against N per ZeRO stage with the GPU's line (left), and step time
    against N with and without overlap (right; stages 0-2 send the same bytes, so they share a line; dots mark
    the configurations that fit in memory)."""
    fig, (ax_mem, ax_time) = plt.subplots(1, 2, figsize=figsize)
    memory = table.drop_duplicates(["stage", "workers"])
    for stage, rows in memory.groupby("stage"):
        ax_mem.loglog(rows.workers, rows.total_gib, "o-", ms=3, label=f"ZeRO-{stage}")
    ax_mem.axhline(gpu_gib, color="k", ls="--", lw=1, label=f"{gpu_gib:g} GiB per GPU")
    ax_mem.set_xscale("log", base=2)
    ax_mem.set_xlabel("GPUs N")
    ax_mem.set_ylabel("memory per GPU (GiB)")
    ax_mem.legend(fontsize="small")
    for (third, overlap), rows in table.assign(third=table.stage == 3).groupby(["third", "overlap"]):
        rows = rows.drop_duplicates("workers")
        name = "ZeRO-3" if third else "ZeRO-0/1/2"
        ax_time.plot(rows.workers, rows.step_s, "-" if overlap else "--", color="tab:red" if third else "tab:blue",
                     label=f"{name}, {'overlapped' if overlap else 'not overlapped'}")
        fits = rows[rows.fits]
        ax_time.plot(fits.workers, fits.step_s, "o", ms=3, color="tab:red" if third else "tab:blue")
    compute = table.drop_duplicates("workers")
    ax_time.plot(compute.workers, compute.compute_s, "k:", label="compute alone")
    ax_time.set_xscale("log", base=2)
    ax_time.set_ylim(bottom=0)
    ax_time.set_xlabel("GPUs N")
    ax_time.set_ylabel("seconds per step (simulated)")
    ax_time.legend(fontsize="small")
    fig.tight_layout()
    return fig


def plot_layouts_at_scale(table: pd.DataFrame, figsize: tuple[float, float] = (7, 3.8)) -> Figure:
    """sim.transformer's best_layouts for one or more models: the fastest fitting layout's step time against N
    (solid, each point labelled with its layout) and its compute alone (dotted)."""
    fig, ax = plt.subplots(figsize=figsize)
    for model, rows in table.groupby("model", sort=False):
        line, = ax.loglog(rows.gpus, rows.step_s, "o-", ms=4, label=f"{model}: best layout that fits")
        ax.loglog(rows.gpus, rows.compute_s, ":", color=line.get_color(), label=f"{model}: compute alone")
        for row in rows.itertuples():
            ax.annotate(row.layout, (row.gpus, row.step_s), fontsize=7, xytext=(3, 4), textcoords="offset points")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("GPUs N")
    ax.set_ylabel("seconds per step (predicted)")
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig
