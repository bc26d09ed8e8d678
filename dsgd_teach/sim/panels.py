"""Two widget panels on one config: the real cluster on the left, the simulator at scale on the right."""

from __future__ import annotations

from typing import Any

import ipywidgets as widgets

from ..panel import ExperimentPanel
from ..runtime.clusters.workers import capacity
from .config import MAX_SIM_WORKERS, from_config
from .plots import plot_sim_live
from .run import run_simulated

STRAGGLERS = ("none", "exponential", "lognormal", "slow_worker")


def _controls(workers: int, max_workers: int, max_backups: int) -> dict[str, widgets.ValueWidget]:
    """workers, backups (whose maximum follows workers), straggler model and severity."""
    slider = widgets.IntSlider if max_workers <= 16 else widgets.BoundedIntText
    n = slider(value=workers, min=1, max=max_workers, description="workers", continuous_update=False)
    b = widgets.IntSlider(value=0, min=0, max=min(max_backups, workers), description="backups",
                          continuous_update=False)

    def follow(change: dict[str, Any]) -> None:
        value = max(1, min(int(change["new"]), max_workers))
        if value != change["new"]:
            n.value = value
        b.max = min(max_backups, value)

    n.observe(follow, names="value")
    return {
        "workers": n,
        "backups": b,
        "straggler": widgets.Dropdown(options=STRAGGLERS, value="exponential", description="straggler"),
        "severity": widgets.FloatSlider(value=0.02, min=0.0, max=0.2, step=0.005, description="severity (s)",
                                        continuous_update=False, readout_format=".3f"),
    }


def real_and_simulated(
    client: Any, real_config: Any, real_run: Any, machine: dict[str, Any] | None = None, *,
    real_max_workers: int = 4, figsize: tuple[float, float] = (5.0, 3.0),
) -> widgets.HBox:
    """A "real cluster" panel running real_run(real_config) next to a "simulated at scale" panel on the same
    config (through from_config, with the fitted machine numbers), each with workers/backups/straggler controls.
    """
    sim_config = from_config(real_config, **(machine or {}))
    if client is not None:  # what this cluster can give
        real_max_workers = capacity(client, real_max_workers)
    real_panel = ExperimentPanel(
        client, real_run, real_config, _controls(real_config.workers, real_max_workers, real_max_workers),
        None, title="real cluster", figsize=figsize,  # the default loss plot: a real run is not "simulated"
    )
    sim_panel = ExperimentPanel(
        client, run_simulated, sim_config, _controls(min(100, MAX_SIM_WORKERS), MAX_SIM_WORKERS, 100),
        plot_sim_live, resize_cluster=False, title="simulated at scale", figsize=figsize,
        redraw_every_s=2.0,  # simulated events arrive far faster than a figure redraws
    )
    box = widgets.HBox([real_panel, sim_panel])
    box.panels = (real_panel, sim_panel)  # for tests and scripts: panel.wait(), panel.result
    return box
