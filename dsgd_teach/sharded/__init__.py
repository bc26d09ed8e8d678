"""Chapter 09: data parallelism that fits — overlapped bucketed DDP, ZeRO-1/2/3 with Adam, mixed precision, checkpointing."""

from .buckets import assign_buckets, bucket_bytes
from .ddp import OverlappedDDP
from .ddp_run import DDPConfig, run_ddp
from .shard_ops import all_gather, padded_numel, reduce_scatter, ring_all_gather, ring_reduce_scatter
from .zero import LossScaler, Stage0, Stage1, Stage2, ZeroAdam, traffic_formula, zero_formula
from .zero_run import ZeroConfig, run_zero
from .zero_stage3 import Stage3  # importing it registers stage 3 with ZeroAdam

__all__ = [
    "DDPConfig",
    "LossScaler",
    "ZeroAdam",
    "ZeroConfig",
    "OverlappedDDP",
    "Stage0",
    "Stage1",
    "Stage2",
    "Stage3",
    "all_gather",
    "assign_buckets",
    "bucket_bytes",
    "padded_numel",
    "reduce_scatter",
    "ring_all_gather",
    "ring_reduce_scatter",
    "run_ddp",
    "run_zero",
    "traffic_formula",
    "zero_formula",
]

from typing import Any  # noqa: E402

from ..experiments import Experiment  # noqa: E402
from .scaling import ScalingConfig, run_scaling  # noqa: E402


def _plot_ddp(result: Any) -> Any:
    """Figure for the CLI: the last step's timeline and the step times of a run_ddp result."""
    import matplotlib.pyplot as plt

    from .plots import plot_ddp_live

    fig = plt.figure(figsize=(11, 3.6))
    plot_ddp_live(fig, result.trace)
    return fig


def _plot_zero(result: Any) -> Any:
    """Figure for the CLI: memory held against the formula, and the loss, of a run_zero result."""
    import matplotlib.pyplot as plt

    from .plots import plot_zero_live

    fig = plt.figure(figsize=(11, 3.6))
    plot_zero_live(fig, result.trace)
    return fig


EXPERIMENTS = {
    "ddp-overlap": Experiment("ddp-overlap", DDPConfig, run_ddp,
                              "bucketed DDP whose allreduces (ring or library) overlap backward; no_sync accumulation",
                              _plot_ddp),
    "zero": Experiment("zero", ZeroConfig, run_zero,
                       "Adam sharded by ZeRO stage 0-3 from reduce-scatter and all-gather; memory and bytes per rank",
                       _plot_zero),
    "large-batch": Experiment("large-batch", ScalingConfig, run_scaling,
                              "linear learning-rate scaling with and without warm-up over growing batch sizes"),
}
