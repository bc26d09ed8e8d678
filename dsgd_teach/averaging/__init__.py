"""Chapter 08: parameter averaging — local SGD, elastic averaging SGD, federated averaging (FedAvg, FedSGD)."""

from typing import Any

from ..experiments import Experiment
from ..trace import Result
from .config import EASGDConfig, FedAvgConfig, LocalSGDConfig
from .easgd import run_easgd
from .fedavg import fed_curve, rounds_to_accuracy, run_fedavg, weighted_average
from .local_sgd import bytes_to_accuracy, local_sgd_curve, run_local_sgd
from .partitions import PARTITIONS, client_rows, client_sizes, describe, split_rows

__all__ = [
    "EXPERIMENTS",
    "PARTITIONS",
    "EASGDConfig",
    "FedAvgConfig",
    "LocalSGDConfig",
    "bytes_to_accuracy",
    "client_rows",
    "client_sizes",
    "describe",
    "fed_curve",
    "local_sgd_curve",
    "rounds_to_accuracy",
    "run_easgd",
    "run_fedavg",
    "run_local_sgd",
    "split_rows",
    "weighted_average",
]



def _plot_local_sgd(result: Result) -> Any:
    """Figure for the CLI: loss against local steps, bytes and time (plots load matplotlib only when asked)."""
    from .plots import plot_local_sgd

    return plot_local_sgd({f"H = {result.config.sync_every}": result})


def _plot_federated(result: Result) -> Any:
    """Figure for the CLI: test accuracy against rounds and bytes."""
    from .plots import plot_federated

    return plot_federated({result.config.algorithm: result})


def _plot_elastic(result: Result) -> Any:
    """Figure for the CLI: each worker's distance to the center at its exchanges."""
    import matplotlib.pyplot as plt

    from .plots import plot_elastic

    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    plot_elastic(ax, {"easgd": result})
    fig.tight_layout()
    return fig


EXPERIMENTS = {
    "local-sgd": Experiment("local-sgd", LocalSGDConfig, run_local_sgd,
                            "local SGD: H local steps per replica, then the parameters averaged by an allreduce",
                            _plot_local_sgd),
    "easgd": Experiment("easgd", EASGDConfig, run_easgd,
                        "elastic averaging SGD: workers and a center variable on a parameter-server actor",
                        _plot_elastic),
    "fedavg": Experiment("fedavg", FedAvgConfig, run_fedavg,
                         "federated averaging (or FedSGD) over IID or non-IID clients, a fraction C per round",
                         _plot_federated),
}
