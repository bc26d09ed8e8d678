"""Elastic averaging SGD (Zhang, Choromanska & LeCun 2015), asynchronous form, with the center on a PS actor.

Each worker x_i runs SGD on its shard; every `sync_every` (tau) steps it reads the center variable c from the
parameter server (chapter 03's ParamShard actor), and the two pull towards each other by alpha times their
difference d = x_i - c: the worker moves x_i -= alpha d, and pushes -d to the server, whose SGD rule with step
alpha applies c += alpha d. Unlike plain averaging nobody is overwritten: the elastic force lets the workers
explore around the center, and alpha sets how stiff the spring is (alpha = 1/N with tau = 1 is close to averaging).
"""

from __future__ import annotations

import time

import numpy as np
from distributed import Client

from ..models import loss_and_grad
from ..problem import get_problem
from ..ps.monitor import quiet_released_shards
from ..ps.replica import leave_thread_pool
from ..ps.server import ShardedServer, ShardUnavailable
from ..runtime.ranks.live import WorkerContext, run_live
from ..sampling import batch_indices
from ..trace import OnUpdate, Result, TraceRecorder, stat
from .config import EASGDConfig


def easgd_worker(ctx: WorkerContext, server: ShardedServer, config: EASGDConfig) -> np.ndarray:
    """One EASGD worker: local SGD steps, an elastic exchange with the center every sync_every steps."""
    leave_thread_pool()
    problem = get_problem(config.problem)
    shard = problem.train_shard(ctx.rank, ctx.world)
    x = problem.init_params.astype(np.float32, copy=True)
    alpha = np.float32(config.alpha)
    for step in range(config.steps):
        idx = batch_indices(shard.n_samples, config.batch_size, step, config.seed + ctx.rank)
        loss, grad = loss_and_grad(problem.model, x, shard.X[idx], shard.y[idx])
        x -= np.float32(config.lr) * grad
        ctx.emit(step=step, event="local_step", loss=loss)
        if (step + 1) % config.sync_every == 0:
            t = time.perf_counter()
            try:
                center, versions = server.pull(timeout=config.timeout_s)
                diff = x - center
                x -= alpha * diff
                server.push((ctx.rank, step), -diff, versions)  # the server's step alpha: c += alpha * diff
            except ShardUnavailable as exc:
                raise RuntimeError(f"EASGD's center variable is gone, and the run cannot go on without it: {exc}") from exc
            ctx.emit(step=step, event="elastic", spread=float(np.linalg.norm(diff)), bytes_sent=2 * x.nbytes,
                     comm_s=time.perf_counter() - t, version_read=versions[0], version_applied=versions[0] + 1)
        if ctx.should_stop():
            break
    return x


def run_easgd(config: EASGDConfig, client: Client, on_update: OnUpdate | None = None) -> Result:
    """Asynchronous EASGD on the cluster; the result's params are the center variable, evaluated at the end."""
    t0 = time.perf_counter()
    recorder = TraceRecorder(on_update)
    problem = get_problem(config.problem)
    with quiet_released_shards():
        server = ShardedServer.start(client, problem.init_params, 1, "sgd", config.alpha, timeout_s=config.timeout_s)
        try:
            workers, stopped = run_live(client, easgd_worker, [(server, config)] * config.workers, recorder,
                                        on_worker_lost="drop")
            center, versions = server.pull()
        finally:
            server.close()
    metrics = problem.evaluate(center)
    recorder.record(step=config.steps - 1, event="eval", loss=metrics["train_loss"], version_applied=versions[0],
                    **metrics)
    trace = recorder.frame()
    elastic = trace[trace.event == "elastic"]
    done = [w for w in workers if w is not None]
    summary = {
        "wall_s": time.perf_counter() - t0,
        "exchanges": len(elastic),
        "bytes_sent": int(elastic.bytes_sent.sum()),
        "mean_spread": stat(elastic, "spread", "mean"),
        "worker_test_accuracy": float(np.mean([problem.evaluate(w)["test_accuracy"] for w in done])) if done else
        float("nan"),
        "final_train_loss": metrics["train_loss"],
        "final_test_accuracy": metrics["test_accuracy"],
    }
    return Result(config, trace, summary, center, stopped)
