"""Chapter 03: parameter servers on the live cluster, Downpour SGD (Dean et al. 2012) and a synchronous contrast."""

from ..experiments import Experiment
from .config import DownpourConfig, PSConfig, SyncPSConfig
from .downpour import downpour_replica, run_downpour
from .optimizers import OPTIMIZERS, ServerAdagrad, ServerSGD
from .plots import plot_overview, plot_ps_live, plot_result, plot_shard_traffic, plot_staleness, shard_traffic
from .server import ShardedServer, ShardInfo, ShardUnavailable, shard_bounds
from .shard import BarrierTimeout, ParamShard
from .syncps import run_sync_ps, sync_replica

__all__ = [
    "EXPERIMENTS",
    "OPTIMIZERS",
    "BarrierTimeout",
    "DownpourConfig",
    "PSConfig",
    "ParamShard",
    "ServerAdagrad",
    "ServerSGD",
    "ShardInfo",
    "ShardUnavailable",
    "ShardedServer",
    "SyncPSConfig",
    "downpour_replica",
    "plot_overview",
    "plot_ps_live",
    "plot_result",
    "plot_shard_traffic",
    "plot_staleness",
    "run_downpour",
    "run_sync_ps",
    "shard_bounds",
    "shard_traffic",
    "sync_replica",
]

EXPERIMENTS = {
    "downpour": Experiment(
        "downpour", DownpourConfig, run_downpour,
        "Downpour SGD: asynchronous replicas around a sharded parameter server (SGD or Adagrad at the server)",
        plot_result,
    ),
    "sync-ps": Experiment(
        "sync-ps", SyncPSConfig, run_sync_ps, "synchronous parameter server: a barrier every step", plot_result
    ),
}
