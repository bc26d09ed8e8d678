"""The chapter's widget panel: intra-op threads, inter-op threads, problem size and processes, vs 1/1/1."""

from __future__ import annotations

import ipywidgets as widgets
from distributed import Client

from ..panel import ExperimentPanel
from .fresh import worker_cores
from .lab import ThreadsLabConfig, run_threads_lab
from .plots import plot_lab


def threads_panel(client: Client, config: ThreadsLabConfig | None = None) -> ExperimentPanel:
    """An ExperimentPanel running run_threads_lab; sliders reach twice the worker's cores (to oversubscribe)."""
    config = config or ThreadsLabConfig()
    top = max(4, 2 * worker_cores(client))
    style = {"description_width": "initial"}

    def slider(name: str, label: str, hi: int) -> widgets.IntSlider:
        return widgets.IntSlider(value=getattr(config, name), min=1, max=hi, description=label,
                                 continuous_update=False, style=style)

    controls = {
        "intra_threads": slider("intra_threads", "intra-op threads", top),
        "interop_threads": slider("interop_threads", "inter-op threads", top),
        "size": widgets.Dropdown(options=sorted({128, 256, 512, 1024, 2048, config.size}), value=config.size,
                                 description="problem size n", style=style),
        "processes": slider("processes", "processes", top),
    }
    return ExperimentPanel(client, run=run_threads_lab, config=config, controls=controls, plot=plot_lab,
                           title="Thread pools: your setting against 1 process x 1 thread x 1 inter-op thread")
