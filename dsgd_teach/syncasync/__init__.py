"""Chapter 04: synchronous vs asynchronous SGD — stragglers, backup workers, staleness, 1-bit compression."""

from .async_sgd import AsyncConfig, run_async
from .delays import STRAGGLER_MODELS, DelayModel
from .onebit import OneBitCompressor, quantize
from .playground import PlaygroundConfig, make_panel, run_playground
from .schedule import StalenessGate, SyncRound, simulate_async
from .sync import SyncConfig, run_sync

__all__ = [
    "STRAGGLER_MODELS",
    "AsyncConfig",
    "DelayModel",
    "OneBitCompressor",
    "PlaygroundConfig",
    "StalenessGate",
    "SyncConfig",
    "SyncRound",
    "make_panel",
    "quantize",
    "run_async",
    "run_playground",
    "run_sync",
    "simulate_async",
]

from ..experiments import Experiment  # noqa: E402


def plot_live(fig, trace):  # noqa: ANN001, ANN201 - matplotlib figure, trace DataFrame
    """Live plot (imported lazily: worker processes never load matplotlib)."""
    from .plots import plot_live as draw

    draw(fig, trace)


EXPERIMENTS = {
    "sync-sgd": Experiment(
        "sync-sgd", SyncConfig, run_sync, "synchronous SGD with stragglers, backup workers and 1-bit SGD", plot_live
    ),
    "async-sgd": Experiment(
        "async-sgd", AsyncConfig, run_async, "asynchronous SGD with measured, bounded or damped staleness", plot_live
    ),
    "sync-async": Experiment(
        "sync-async", PlaygroundConfig, run_playground, "the chapter 04 playground: sync or async", plot_live
    ),
}
