"""Chapter 08 control panels: local SGD (workers, H) and federated averaging (clients, E, C, IID or not)."""

from __future__ import annotations

import ipywidgets as widgets
import pandas as pd
from distributed import Client
from matplotlib.figure import Figure

from ..config import sized
from ..panel import ExperimentPanel
from ..runtime.clusters.cluster import worker_addresses
from .config import FedAvgConfig, LocalSGDConfig
from .fedavg import fed_curve, run_fedavg
from .local_sgd import local_sgd_curve, run_local_sgd
from .plots import mark_regroups


def plot_local_sgd_live(fig: Figure, trace: pd.DataFrame) -> None:
    """Live view of a local-SGD run: training loss against local steps and against bytes sent."""
    fig.clear()
    left, right = fig.subplots(1, 2, sharey=True)
    if "round" in trace and (trace.event == "eval").any() and (trace.event == "average").any():
        curve = local_sgd_curve(trace)
        left.plot(curve.updates, curve.train_loss, marker=".")
        right.plot(curve.bytes, curve.train_loss, marker=".")
        mark_regroups(left, trace)
    left.set_xlabel("local steps per replica")
    right.set_xlabel("bytes sent (all ranks)")
    left.set_ylabel("training loss")
    fig.tight_layout()


def plot_fed_live(fig: Figure, trace: pd.DataFrame) -> None:
    """Live view of a federated run: test accuracy per round, and clients kept or lost per round."""
    fig.clear()
    left, right = fig.subplots(1, 2)
    if (trace.event == "eval").any():
        curve = fed_curve(trace)
        left.plot(curve.rounds, curve.test_accuracy, marker=".")
    updates = trace[trace.event == "update"]
    if len(updates) and "clients_kept" in updates:
        right.bar(updates["round"] + 1, updates.clients_kept, color="tab:blue", label="averaged")
        right.bar(updates["round"] + 1, updates.clients_lost, bottom=updates.clients_kept, color="tab:red",
                  label="lost")
        right.legend(fontsize=8)
    left.set_xlabel("round")
    left.set_ylabel("test accuracy")
    right.set_xlabel("round")
    right.set_ylabel("clients")
    fig.tight_layout()


def local_sgd_panel(client: Client, config: LocalSGDConfig | None = None) -> ExperimentPanel:
    """Workers (up to the cluster's size; the panel never resizes it) and the averaging period H."""
    n = max(1, len(worker_addresses(client)))
    return ExperimentPanel(
        client, run_local_sgd, config or LocalSGDConfig(workers=min(2, n), steps=sized(240, 40)),
        controls={
            "workers": widgets.IntSlider(value=min(2, n), min=1, max=n, description="workers",
                                         continuous_update=False),
            "sync_every": widgets.Dropdown(options=[1, 2, 4, 8, 16, 32, 64], value=8, description="H"),
            "allreduce": widgets.Dropdown(options=["ring", "library", "naive"], value="ring", description="allreduce"),
        },
        plot=plot_local_sgd_live, resize_cluster=False, title="Local SGD: average every H steps",
    )


def fedavg_panel(client: Client, config: FedAvgConfig | None = None) -> ExperimentPanel:
    """Clients N_c, local epochs E, fraction C, IID or non-IID partitions, FedAvg or FedSGD, drop-out rate."""
    return ExperimentPanel(
        client, run_fedavg, config or FedAvgConfig(fraction=0.5, steps=sized(30, 6)),
        controls={
            "algorithm": widgets.Dropdown(options=["fedavg", "fedsgd"], value="fedavg", description="algorithm"),
            "clients": widgets.IntSlider(value=20, min=2, max=100, description="clients N_c", continuous_update=False),
            "local_epochs": widgets.IntSlider(value=5, min=1, max=20, description="epochs E", continuous_update=False),
            "fraction": widgets.FloatSlider(value=0.5, min=0.05, max=1.0, step=0.05, description="fraction C",
                                            continuous_update=False),
            "partition": widgets.Dropdown(options=["iid", "non-iid"], value="non-iid", description="partition"),
            "dropout": widgets.FloatSlider(value=0.0, min=0.0, max=0.9, step=0.1, description="drop-out",
                                           continuous_update=False),
        },
        plot=plot_fed_live, resize_cluster=False, title="Federated averaging: accuracy per round",
    )
