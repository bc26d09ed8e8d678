"""Downpour SGD (Dean et al. 2012): asynchronous model replicas around a sharded parameter server.

Each replica runs as one long-running task on its own worker, on its own data shard. Every n_fetch steps it
fetches the parameters from all shards; every step it computes a minibatch gradient, adds it to an accumulator
and takes a local step; every n_push steps it pushes the accumulator to the shards, which apply it as soon as
it arrives, whatever else arrived in between. Replicas never wait for each other, nor do shards.
"""

from __future__ import annotations

import time

import numpy as np
from distributed import Client

from ..models import loss_and_grad
from ..problem import get_problem
from ..runtime.actors.retries import Stopped
from ..runtime.ranks.live import WorkerContext
from ..sampling import batch_indices
from ..trace import OnUpdate, Result
from .config import DownpourConfig
from .replica import ShardCalls, emit_fetch, emit_push, leave_thread_pool, mean_loss
from .runner import run_ps
from .server import ShardedServer


def downpour_replica(ctx: WorkerContext, server: ShardedServer, config: DownpourConfig) -> dict[str, int]:
    """One Downpour replica (the client of Algorithm 'Downpour SGD' in the paper); runs on a worker."""
    leave_thread_pool()
    problem = get_problem(config.problem)
    data = problem.train_shard(ctx.rank, ctx.world)
    shards = ShardCalls(ctx, server, config.timeout_s)  # waits out a shard being restored
    lr = np.float32(config.lr)
    w, versions = problem.init_params.copy(), [0] * server.n_shards
    accum = np.zeros_like(w)
    losses: list[float] = []
    done, fetched = 0, False
    try:
        for step in range(config.steps):
            if ctx.should_stop():
                break
            if step % config.n_fetch == 0 and not fetched:
                w, versions = shards.pull()
                emit_fetch(ctx, server, step, versions)
            fetched = False
            idx = batch_indices(data.n_samples, config.batch_size, step, config.seed + ctx.rank)
            loss, grad = loss_and_grad(problem.model, w, data.X[idx], data.y[idx])
            losses.append(loss)
            accum += grad
            w = w - lr * grad  # the replica's local step between fetches
            if (step + 1) % config.n_push == 0 or step + 1 == config.steps:
                t = time.perf_counter()
                key, sent, read = (ctx.rank, step), accum, versions
                if (step + 1) % config.n_fetch == 0 and step + 1 < config.steps:
                    # the next step fetches anyway: push and fetch in one round trip per shard
                    receipts, w, versions = shards.push_pull(key, sent, read)
                    fetched = True
                else:
                    receipts = shards.push(key, sent, read)
                emit_push(ctx, server, step, mean_loss(losses), receipts, time.perf_counter() - t)
                if fetched:
                    emit_fetch(ctx, server, step + 1, versions)
                accum, losses = np.zeros_like(w), []
            done = step + 1
    except Stopped:
        pass
    return {"rank": ctx.rank, "steps": done}


def run_downpour(config: DownpourConfig, client: Client, on_update: OnUpdate | None = None) -> Result:
    """Downpour SGD on the live cluster: replicas as tasks on the workers, shards as actors (see run_ps)."""
    return run_ps(config, client, on_update, downpour_replica, asynchronous=True)
