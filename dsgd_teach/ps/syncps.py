"""The synchronous parameter server: a barrier every step, the contrast to Downpour in the same framework.

Every replica pulls version t from every shard (waiting until the shard has reached it), computes its minibatch
gradient and pushes it; a shard applies the mean of the R gradients of round t once the last one arrives, which
makes version t+1. With equal batch sizes this is synchronous data-parallel SGD: no staleness, and every
replica waits for the slowest.
"""

from __future__ import annotations

import time

from distributed import Client

from ..models import loss_and_grad
from ..problem import get_problem
from ..runtime.actors.retries import Stopped
from ..runtime.ranks.live import WorkerContext
from ..sampling import batch_indices
from ..trace import OnUpdate, Result
from .config import SyncPSConfig
from .replica import ShardCalls, emit_fetch, emit_push, leave_thread_pool
from .runner import run_ps
from .server import ShardedServer


def sync_replica(ctx: WorkerContext, server: ShardedServer, config: SyncPSConfig) -> dict[str, int]:
    """One replica of the synchronous parameter server; runs on a worker."""
    leave_thread_pool()
    problem = get_problem(config.problem)
    data = problem.train_shard(ctx.rank, ctx.world)
    shards = ShardCalls(ctx, server, config.timeout_s)  # waits out a slow barrier or a shard being restored
    done = 0
    try:
        for step in range(config.steps):
            if ctx.should_stop():
                break
            w, versions = shards.barrier_pull(step)  # waits for every replica's push of step-1
            emit_fetch(ctx, server, step, versions)
            idx = batch_indices(data.n_samples, config.batch_size, step, config.seed + ctx.rank)
            loss, grad = loss_and_grad(problem.model, w, data.X[idx], data.y[idx])
            t = time.perf_counter()
            receipts = shards.push_sync((ctx.rank, step), grad, versions, ctx.world)
            emit_push(ctx, server, step, loss, receipts, time.perf_counter() - t)
            done = step + 1
    except Stopped:
        pass
    return {"rank": ctx.rank, "steps": done}


def run_sync_ps(config: SyncPSConfig, client: Client, on_update: OnUpdate | None = None) -> Result:
    """The synchronous parameter server on the live cluster (a lost replica stops it: its barrier cannot close)."""
    return run_ps(config, client, on_update, sync_replica, asynchronous=False)
