"""Figures of the chapter, each drawn from a trace or from a sweep's DataFrame."""

from __future__ import annotations

from collections.abc import Mapping

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from ..trace import Result


def plot_progress(fig: Figure, trace: pd.DataFrame) -> None:
    """Live panel plot: each worker's recent training loss, and updates applied by all workers, against time."""
    fig.clear()
    ax_loss, ax_updates = fig.subplots(1, 2)
    updates = trace[trace.event == "update"] if len(trace) else trace
    for rank, rows in updates.groupby("worker") if len(updates) else []:
        ax_loss.plot(rows.time, rows.loss, ".-", lw=1, ms=3, label=f"worker {rank}")
        ax_updates.plot(rows.time, rows.step, lw=1, label=f"worker {rank}")
    if len(updates):
        ax_updates.plot(updates.time, updates.version_applied, "k-", lw=1.5, label="all workers")
        ax_loss.legend(fontsize="small")
        ax_updates.legend(fontsize="small")
    ax_loss.set(xlabel="wall-clock time (s)", ylabel="loss of recent updates")
    ax_updates.set(xlabel="wall-clock time (s)", ylabel="updates applied")
    for ax in (ax_loss, ax_updates):
        ax.grid(alpha=0.3)
    fig.tight_layout()


def plot_baselines(results: Mapping[str, Result], figsize: tuple[float, float] = (10, 3.6)) -> Figure:
    """Loss against wall-clock time (from each run's start) and the throughput of each run, side by side."""
    fig = plt.figure(figsize=figsize)
    ax_loss, ax_rate = fig.subplots(1, 2)
    for label, result in results.items():
        rows = result.trace[result.trace.event == "update"].sort_values("time")
        start = result.summary.get("start_s", 0.0)
        t = np.concatenate([[0.0], rows.time - start])  # every run starts from w = 0, loss log 2
        loss = np.concatenate([[np.log(2.0)], rows.loss.rolling(max(1, result.config.workers), min_periods=1).mean()])
        ax_loss.plot(t, loss, "o-", ms=3, label=label)
    ax_loss.set(xlabel="wall-clock time since updating began (s)", ylabel="training loss (recent updates)")
    ax_loss.legend(fontsize="small")
    labels = list(results)
    rates = [results[k].summary["updates_per_s"] / 1e6 for k in labels]
    ax_rate.barh(labels, rates, color=["0.5", "tab:green", "tab:red", "tab:purple"][: len(labels)])
    ax_rate.set(xlabel="million updates per second")
    for ax in (ax_loss, ax_rate):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def plot_scaling(frames: Mapping[str, pd.DataFrame], figsize: tuple[float, float] = (10, 3.6)) -> Figure:
    """Updates per second and speedup against workers, one line per (problem, lock) pair."""
    fig = plt.figure(figsize=figsize)
    ax_rate, ax_speed = fig.subplots(1, 2)
    for name, df in frames.items():
        for lock, rows in df.groupby("lock"):
            label = f"{name}, {'locked' if lock else 'lock-free'}"
            style = "--" if lock else "-"
            ax_rate.plot(rows.workers, rows.updates_per_s / 1e6, style, marker="o", label=label)
            ax_speed.plot(rows.workers, rows.speedup, style, marker="o", label=label)
    top = max(int(df.workers.max()) for df in frames.values())
    ax_speed.plot([1, top], [1, top], "k:", lw=1, label="ideal")
    ticks = sorted({int(w) for df in frames.values() for w in df.workers})
    for ax in (ax_rate, ax_speed):
        ax.set_xticks(ticks)
    ax_rate.set(xlabel="workers", ylabel="million updates per second")
    ax_speed.set(xlabel="workers", ylabel="speedup over 1 lock-free worker")
    for ax in (ax_rate, ax_speed):
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def plot_lost(df: pd.DataFrame, figsize: tuple[float, float] = (6, 3.6)) -> Figure:
    """Fraction of increments lost against density (the fraction of features each row touches)."""
    fig, ax = plt.subplots(figsize=figsize)
    for lock, rows in df.groupby("lock"):
        ax.plot(rows.density, rows.lost_fraction, "--" if lock else "-", marker="o",
                label="with lock" if lock else "lock-free")
    ax.set(xscale="log", xlabel="density (nonzeros per row / features)", ylabel="fraction of updates lost")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def plot_oversubscription(df: pd.DataFrame, figsize: tuple[float, float] = (6, 3.6)) -> Figure:
    """Updates per second against threads in one process, with the number of cores marked."""
    fig, ax = plt.subplots(figsize=figsize)
    for lock, rows in df.groupby("lock"):
        ax.plot(rows.threads, rows.updates_per_s / 1e6, "--" if lock else "-", marker="o",
                label="locked" if lock else "lock-free")
    ax.axvline(int(df.cores.iloc[0]), color="k", lw=1, ls=":", label="cores")
    ax.set(xscale="log", xlabel="threads in one worker process", ylabel="million updates per second")
    ax.set_xticks(sorted(df.threads.unique()), [str(t) for t in sorted(df.threads.unique())])
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def plot_run(result: Result, figsize: tuple[float, float] = (10, 3.6)) -> Figure:
    """A new figure of one run_hogwild result (what `dsgd-teach run hogwild` saves)."""
    fig = plt.figure(figsize=figsize)
    plot_progress(fig, result.trace)
    return fig


def plot_counts(result: Result, figsize: tuple[float, float] = (10, 3.6)) -> Figure:
    """One run_counting result: increments each feature should have received, and how many it lost."""
    from .problem import load_data
    from .reference import sequential_counts

    expected = sequential_counts(load_data(result.config.data_spec), result.config.passes)
    fig = plt.figure(figsize=figsize)
    ax_hits, ax_lost = fig.subplots(1, 2)
    features = np.arange(len(expected))
    ax_hits.loglog(features + 1, np.maximum(expected, 1), label="intended")
    ax_hits.loglog(features + 1, np.maximum(result.params, 1), "--", label="landed")
    ax_hits.set(xlabel="feature rank (1 = most common)", ylabel="increments")
    ax_hits.legend(fontsize="small")
    ax_lost.semilogx(features + 1, expected - result.params, ".", ms=3)
    ax_lost.set(xlabel="feature rank (1 = most common)", ylabel="increments lost")
    for ax in (ax_hits, ax_lost):
        ax.grid(alpha=0.3)
    fig.suptitle(f"lost {result.summary['lost']:,} of {result.summary['intended']:,} increments "
                 f"({'with' if result.config.lock else 'without'} lock)")
    fig.tight_layout()
    return fig
