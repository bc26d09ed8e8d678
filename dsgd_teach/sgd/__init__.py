"""Chapter 01: sequential SGD (the baseline every chapter compares against) and synchronous data parallelism."""

from ..sampling import batch_indices
from .data_parallel import DataParallelConfig, averaged_gradient, run_data_parallel
from .sequential import SGDConfig, run_sgd, sgd_steps

__all__ = [
    "DataParallelConfig",
    "SGDConfig",
    "averaged_gradient",
    "batch_indices",
    "run_data_parallel",
    "run_sgd",
    "sgd_steps",
]

from ..experiments import Experiment  # noqa: E402

EXPERIMENTS = {
    "sgd": Experiment("sgd", SGDConfig, run_sgd, "sequential minibatch SGD on one worker (the baseline)"),
    "data-parallel": Experiment(
        "data-parallel", DataParallelConfig, run_data_parallel, "synchronous data-parallel SGD, gradients averaged"
    ),
}
