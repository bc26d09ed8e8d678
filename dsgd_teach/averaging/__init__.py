"""Chapter 08: parameter averaging — local SGD, elastic averaging SGD, federated averaging (FedAvg, FedSGD)."""

from ..experiments import Experiment
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

EXPERIMENTS = {
    "local-sgd": Experiment("local-sgd", LocalSGDConfig, run_local_sgd,
                            "local SGD: H local steps per replica, then the parameters averaged by an allreduce"),
    "easgd": Experiment("easgd", EASGDConfig, run_easgd,
                        "elastic averaging SGD: workers and a center variable on a parameter-server actor"),
    "fedavg": Experiment("fedavg", FedAvgConfig, run_fedavg,
                         "federated averaging (or FedSGD) over IID or non-IID clients, a fraction C per round"),
}
