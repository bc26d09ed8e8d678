"""Chapter 10: a transformer across the cluster — tensor and sequence, context (ring attention) and expert
parallelism, composed on a device mesh, each predicted before it is measured."""

from typing import Any

from ..experiments import Experiment
from .experiment import TransformerConfig, run


def _plot_run(result: Any) -> Any:
    """Figure for the CLI: loss, bytes per axis and the experts' load of a transformer run."""
    import matplotlib.pyplot as plt

    from .plots import plot_run_live

    fig = plt.figure(figsize=(12, 3.6))
    plot_run_live(fig, result.trace)
    return fig


EXPERIMENTS = {
    "transformer": Experiment("transformer", TransformerConfig, run,
                              "a GPT trained on a mesh of dp × tp × pp × cp/ep ranks, predicted before it is measured",
                              _plot_run),
}

__all__ = ["EXPERIMENTS", "TransformerConfig", "run"]
