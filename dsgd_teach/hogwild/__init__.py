"""Chapter 02: Hogwild — lock-free SGD by several processes (or threads) writing one vector in shared memory."""

from .config import CountingConfig, HogwildConfig
from .run import run_counting, run_hogwild
from .shm import leftover_blocks

__all__ = ["CountingConfig", "HogwildConfig", "leftover_blocks", "run_counting", "run_hogwild"]

from ..experiments import Experiment  # noqa: E402


def _plot_run(result):  # noqa: ANN001, ANN202 - imports matplotlib only when a figure is wanted (not in workers)
    from .plots import plot_run

    return plot_run(result)


def _plot_counts(result):  # noqa: ANN001, ANN202
    from .plots import plot_counts

    return plot_counts(result)


EXPERIMENTS = {
    "hogwild": Experiment(
        "hogwild", HogwildConfig, run_hogwild, "lock-free SGD: workers update one shared-memory vector (Recht et al. 2011)",
        _plot_run,
    ),
    "hogwild-count": Experiment(
        "hogwild-count", CountingConfig, run_counting, "lost updates: intended vs landed increments of shared counters",
        _plot_counts,
    ),
}
