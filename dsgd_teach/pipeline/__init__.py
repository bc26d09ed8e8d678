"""Chapter 07: model parallelism — a model split into stages on workers, pipelines, delayed gradients.

Tensor parallelism, the chapter's second half, is its own package: dsgd_teach.tensor_parallel.
"""

from .experiment import PipelineConfig, measured_bubble, reference_training, run_pipeline, sweep_microbatches
from .schedules import SCHEDULES, ideal_bubble, peak_held
from .stages import boundary_shapes, build_units, microbatch_slices, stage_bounds

__all__ = [
    "SCHEDULES",
    "PipelineConfig",
    "boundary_shapes",
    "build_units",
    "ideal_bubble",
    "measured_bubble",
    "microbatch_slices",
    "peak_held",
    "reference_training",
    "plot_bubble",
    "plot_held",
    "plot_losses",
    "plot_pipeline_live",
    "plot_timeline",
    "run_pipeline",
    "stage_bounds",
    "sweep_microbatches",
]

import importlib  # noqa: E402
from typing import Any  # noqa: E402

from ..experiments import Experiment  # noqa: E402

# Plotting pulls in matplotlib; workers import this package, so plots load only when asked for.
_LAZY = ("plot_bubble", "plot_held", "plot_losses", "plot_pipeline_live", "plot_timeline")


def __getattr__(name: str) -> Any:
    """Load plotting helpers on first use (PEP 562)."""
    if name in _LAZY:
        return getattr(importlib.import_module(".plots", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _plot_pipeline(result: Any) -> Any:
    """Figure for the CLI: the timeline of one step and the loss curve."""
    import matplotlib.pyplot as plt

    from .plots import plot_pipeline_live

    fig = plt.figure(figsize=(10, 3.6))
    plot_pipeline_live(fig, result.trace)
    return fig


EXPERIMENTS = {
    "pipeline": Experiment("pipeline", PipelineConfig, run_pipeline,
                           "a deep MLP split into stages on workers: naive, GPipe, 1F1B or delayed-gradient pipeline",
                           _plot_pipeline),
}
