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
from ..runtime.live import WorkerContext
from ..sampling import batch_indices
from ..trace import OnUpdate, Result
from .config import SyncPSConfig
from .replica import Stopped, emit_fetch, emit_push, leave_thread_pool, retrying
from .runner import run_ps
from .server import START_TIMEOUT_S, ShardedServer
from .shard import BarrierTimeout

#: How long one barrier wait lasts before the replica re-checks the stop flag (a stop is honoured this fast).
BARRIER_SLICE_S = 0.25


def barrier_pull(ctx: WorkerContext, server: ShardedServer, step: int, timeout_s: float) -> tuple:
    """Pull version `step` from every shard, waiting for the others' pushes in slices; BarrierTimeout after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return retrying(
                ctx, server, lambda: server.pull([step] * server.n_shards, BARRIER_SLICE_S), 3 * timeout_s
            )
        except BarrierTimeout:
            if ctx.should_stop():
                raise Stopped from None
            if time.monotonic() > deadline:
                raise


def sync_replica(ctx: WorkerContext, server: ShardedServer, config: SyncPSConfig) -> dict[str, int]:
    """One replica of the synchronous parameter server; runs on a worker."""
    leave_thread_pool()
    problem = get_problem(config.problem)
    data = problem.train_shard(ctx.rank, ctx.world)
    done = 0
    try:
        for step in range(config.steps):
            if ctx.should_stop():
                break
            # the first barrier also waits for the slowest replica to start (a fresh worker imports torch)
            wait_s = config.timeout_s + (START_TIMEOUT_S if step == 0 else 2 * config.timeout_s)
            w, versions = barrier_pull(ctx, server, step, wait_s)
            emit_fetch(ctx, server, step, versions)
            idx = batch_indices(data.n_samples, config.batch_size, step, config.seed + ctx.rank)
            loss, grad = loss_and_grad(problem.model, w, data.X[idx], data.y[idx])
            t = time.perf_counter()
            receipts = retrying(
                ctx, server, lambda g=grad, v=versions, s=step: server.push_sync((ctx.rank, s), g, v, ctx.world),
                3 * config.timeout_s,
            )
            emit_push(ctx, server, step, loss, receipts, time.perf_counter() - t)
            done = step + 1
    except Stopped:
        pass
    return {"rank": ctx.rank, "steps": done}


def run_sync_ps(config: SyncPSConfig, client: Client, on_update: OnUpdate | None = None) -> Result:
    """The synchronous parameter server on the live cluster (a lost replica stops it: its barrier cannot close)."""
    return run_ps(config, client, on_update, sync_replica, asynchronous=False)
