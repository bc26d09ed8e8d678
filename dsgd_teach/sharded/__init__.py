"""Chapter 09: data parallelism that fits — overlapped bucketed DDP, ZeRO-1/2/3 with Adam, mixed precision, checkpointing."""

from .buckets import assign_buckets, bucket_bytes
from .ddp import OverlappedDDP
from .ddp_run import DDPConfig, run_ddp
from .shard_ops import all_gather, padded_numel, reduce_scatter, ring_all_gather, ring_reduce_scatter
from .zero import LossScaler, ZeroAdam, traffic_formula, zero_formula
from .zero_run import ZeroConfig, run_zero

__all__ = [
    "DDPConfig",
    "LossScaler",
    "ZeroAdam",
    "ZeroConfig",
    "OverlappedDDP",
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
