"""Chapter 05: collective communication from scratch — allreduce by hand (star, doubling, binomial tree, halving-doubling, ring)."""

from ..runtime.ranks.group import (
    GroupSpec,
    find_free_port,
    plan_group,
    port_is_free,
    process_group,
    run_in_group,
)
from .algorithms import (
    ALGORITHMS,
    HAND_WRITTEN,
    binomial_allreduce,
    chunk_sizes,
    doubling_allreduce,
    elements_sent,
    get_allreduce,
    halving_doubling_allreduce,
    library_allreduce,
    naive_allreduce,
    ring_allreduce,
    ring_schedule,
    schedule,
)
from .cost_model import AlphaBeta, bus_bandwidth, fit_alpha_beta, predict_seconds
from .data_parallel import AllreduceSGDConfig, run_allreduce_sgd
from .experiment import (
    AllreduceConfig,
    SweepConfig,
    expected_sum,
    run_allreduce,
    run_sweep,
    verify_algorithms,
)

__all__ = [
    "ALGORITHMS",
    "HAND_WRITTEN",
    "AllreduceConfig",
    "AllreduceSGDConfig",
    "AlphaBeta",
    "GroupSpec",
    "SweepConfig",
    "binomial_allreduce",
    "bus_bandwidth",
    "chunk_sizes",
    "compare_links",
    "doubling_allreduce",
    "draw_ring_step",
    "elements_sent",
    "expected_sum",
    "find_free_port",
    "fit_alpha_beta",
    "get_allreduce",
    "halving_doubling_allreduce",
    "library_allreduce",
    "messages_from_trace",
    "naive_allreduce",
    "plan_group",
    "plot_allreduce_live",
    "plot_links",
    "plot_sweep",
    "plot_time_vs_workers",
    "port_is_free",
    "predict_seconds",
    "process_group",
    "ring_allreduce",
    "ring_schedule",
    "ring_states",
    "ring_stepper",
    "run_allreduce",
    "run_allreduce_sgd",
    "run_in_group",
    "run_sweep",
    "schedule",
    "verify_algorithms",
]

import importlib  # noqa: E402
from typing import Any  # noqa: E402

from ..experiments import Experiment  # noqa: E402

# Plotting pulls in matplotlib (~30 MB); workers import this package, so plots load only when asked for.
_LAZY = {
    "compare_links": "plots", "plot_allreduce_live": "plots", "plot_links": "plots", "plot_sweep": "plots",
    "plot_time_vs_workers": "plots", "draw_ring_step": "ringviz", "messages_from_trace": "ringviz",
    "ring_states": "ringviz", "ring_stepper": "ringviz",
}


def __getattr__(name: str) -> Any:
    """Load plotting helpers on first use (PEP 562)."""
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _plot_allreduce(result: Any) -> Any:
    """Figure for the CLI: bytes per link and time per repeat of a run_allreduce result."""
    import matplotlib.pyplot as plt

    from .plots import plot_allreduce_live

    fig = plt.figure(figsize=(10, 3.6))
    plot_allreduce_live(fig, result.trace)
    return fig


def _plot_sweep(result: Any) -> Any:
    """Figure for the CLI: measured and predicted time against message size."""
    import matplotlib.pyplot as plt

    from .plots import plot_sweep

    fig, ax = plt.subplots(figsize=(6, 4))
    plot_sweep(ax, result)
    fig.tight_layout()
    return fig


def _plot_loss(result: Any) -> Any:
    """Figure for the CLI: the loss curves of a run_allreduce_sgd result."""
    from ..plots import compare

    return compare({f"allreduce = {result.config.allreduce}": result})


EXPERIMENTS = {
    "allreduce": Experiment("allreduce", AllreduceConfig, run_allreduce,
                            "one allreduce algorithm (naive, doubling, binomial, halving-doubling, ring, library), every message logged",
                            _plot_allreduce),
    "allreduce-sweep": Experiment("allreduce-sweep", SweepConfig, run_sweep,
                                  "time every allreduce against message size and fit the alpha-beta model",
                                  _plot_sweep),
    "allreduce-sgd": Experiment("allreduce-sgd", AllreduceSGDConfig, run_allreduce_sgd,
                                "data-parallel SGD with gradients averaged by a hand-written or library allreduce",
                                _plot_loss),
}
