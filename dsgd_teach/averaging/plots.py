"""Chapter 08 plots, all read from the event traces: loss against updates, bytes and time; spread; drift."""

from __future__ import annotations

from collections.abc import Mapping

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from ..trace import Result
from .fedavg import fed_curve
from .local_sgd import local_sgd_curve


def plot_local_sgd(results: Mapping[str, Result], metric: str = "train_loss") -> Figure:
    """Three panels: `metric` against local steps, against bytes sent (all ranks) and against wall-clock time."""
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8), sharey=True)
    for label, result in results.items():
        curve = local_sgd_curve(result.trace)
        for ax, x in zip(axes, ("updates", "bytes", "time"), strict=True):
            ax.plot(curve[x], curve[metric], marker=".", label=label)
        mark_regroups(axes[0], result.trace)
    for ax, name in zip(axes, ("local steps per replica", "bytes sent (all ranks)", "seconds"), strict=True):
        ax.set_xlabel(name)
        ax.grid(alpha=0.3)
    axes[1].set_xscale("log")
    axes[0].set_ylabel(metric.replace("_", " "))
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    return fig


def mark_regroups(ax: Axes, trace: pd.DataFrame) -> None:
    """A dashed line at each local step where the replicas left after a worker died regrouped."""
    for row in trace[trace.event == "regroup"].itertuples():
        ax.axvline(row.step, color="tab:red", ls="--", lw=1)
        ax.annotate(f"worker lost: {int(row.world)} left", (row.step, 1), xycoords=("data", "axes fraction"),
                    xytext=(3, -12), textcoords="offset points", color="tab:red", fontsize=8)


def plot_spread(ax: Axes, results: Mapping[str, Result]) -> Axes:
    """Mean distance of the replicas to their average, measured just before each average, against local steps."""
    for label, result in results.items():
        averages = result.trace[result.trace.event == "average"]
        spread = averages.groupby("step").spread.mean()
        ax.plot(spread.index + 1, spread.values, marker=".", label=label)
    ax.set_xlabel("local steps per replica")
    ax.set_ylabel("‖replica − mean‖ before averaging")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return ax


def plot_federated(results: Mapping[str, Result], target: float | None = None) -> Figure:
    """Test accuracy against communication rounds and against bytes, with an optional target line."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), sharey=True)
    for label, result in results.items():
        curve = fed_curve(result.trace)
        axes[0].plot(curve.rounds, curve.test_accuracy, label=label)
        axes[1].plot(curve.cum_bytes, curve.test_accuracy, label=label)
    for ax, name in zip(axes, ("communication rounds", "bytes sent (server and clients)"), strict=True):
        ax.set_xlabel(name)
        ax.grid(alpha=0.3)
        if target:
            ax.axhline(target, color="grey", ls="--", lw=1)
    axes[1].set_xscale("log")
    axes[0].set_ylabel("test accuracy")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_drift(ax: Axes, results: Mapping[str, Result]) -> Axes:
    """Client drift: mean distance of each round's client models to their average, per round."""
    for label, result in results.items():
        kept = result.trace[result.trace.event == "client_update"]
        drift = kept.groupby("round").drift.mean()
        ax.plot(drift.index + 1, drift.values, marker=".", label=label)
    ax.set_xlabel("round")
    ax.set_ylabel("‖client model − average‖")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return ax


def plot_rounds_with_losses(ax: Axes, result: Result) -> Axes:
    """Clients kept and lost per round, as stacked bars (drop-outs and dead workers show in red)."""
    updates = result.trace[result.trace.event == "update"]
    ax.bar(updates["round"] + 1, updates.clients_kept, color="tab:blue", label="averaged")
    ax.bar(updates["round"] + 1, updates.clients_lost, bottom=updates.clients_kept, color="tab:red", label="lost")
    ax.set_xlabel("round")
    ax.set_ylabel("clients")
    ax.legend(fontsize=8)
    return ax


def plot_elastic(ax: Axes, results: Mapping[str, Result]) -> Axes:
    """EASGD: each worker's distance to the center at every elastic exchange, against its local steps."""
    for label, result in results.items():
        elastic = result.trace[result.trace.event == "elastic"]
        for worker, rows in elastic.groupby("worker"):
            ax.plot(rows.step + 1, rows.spread, marker=".", label=f"{label}, worker {worker}")
    ax.set_xlabel("local steps")
    ax.set_ylabel("‖worker − center‖ at the exchange")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return ax
