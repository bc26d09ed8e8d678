"""The chapter's widget panel: workers, density and skew (sparsity), lock or turns on/off, learning rate, live plot."""

from __future__ import annotations

import ipywidgets as widgets
from distributed import Client

from ..config import sized
from ..panel import ExperimentPanel
from ..runtime.clusters.workers import capacity
from .config import HogwildConfig
from .plots import plot_progress
from .run import run_hogwild


def hogwild_panel(client: Client, config: HogwildConfig | None = None, max_workers: int = 4) -> ExperimentPanel:
    """A panel running run_hogwild; the cluster is resized to the chosen number of workers before each run.

    The workers slider reaches max_workers, or fewer when the cluster cannot grow that far.
    """
    max_workers = capacity(client, max_workers)
    # Small enough that every density up to 1.0 stays inside the size limit; epochs make a run last seconds.
    config = config or HogwildConfig(n_samples=2_000, n_features=2_000, density=0.005, epochs=sized(1_000, 200),
                                     report_every=2_000)
    style = {"description_width": "initial"}
    controls = {
        "workers": widgets.IntSlider(value=config.workers, min=1, max=max_workers, description="workers",
                                     continuous_update=False, style=style),
        "density": widgets.FloatLogSlider(value=config.density, base=10, min=-3, max=0, step=0.25,
                                          description="density", readout_format=".4f",
                                          tooltip="nonzeros per row ÷ features",
                                          continuous_update=False, style=style),
        "skew": widgets.FloatSlider(value=config.skew, min=0.0, max=2.0, step=0.1, description="feature skew",
                                    tooltip="0: features used evenly; 1.1: word-like, a few features in most rows",
                                    continuous_update=False, style=style),
        "epochs": widgets.IntSlider(value=config.epochs, min=10, max=5_000, step=10, description="epochs",
                                    continuous_update=False, style=style),
        "lock": widgets.Checkbox(value=config.lock, description="lock around every update"),
        "round_robin": widgets.Checkbox(value=config.round_robin, description="take turns (round-robin)"),
        "lr": widgets.FloatLogSlider(value=config.lr, base=10, min=-2, max=1, step=0.1, description="learning rate",
                                     continuous_update=False, style=style),
    }
    return ExperimentPanel(client, run=run_hogwild, config=config, controls=controls, plot=plot_progress,
                           resize_cluster=True, title="Hogwild: lock-free SGD on shared memory")
