"""The driver side shared by Downpour and the synchronous parameter server: start, watch, summarise, clean up."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
from distributed import Client

from ..problem import Problem, get_problem
from ..runtime.clusters.workers import get_workers
from ..runtime.ranks.live import run_live
from ..trace import OnUpdate, Result, StopRequested, ratio, stat
from .config import PSConfig
from .monitor import ServerWatch, quiet_released_shards
from .server import ShardedServer


def check_replicas_and_shards(config: PSConfig, client: Client, n_params: int) -> None:
    """Refuse configs the cluster or the model cannot run: replicas must run at once, shards need coordinates."""
    get_workers(client, config.replicas, policy="present", what=f"replicas={config.replicas}", instead="use fewer replicas")
    if config.shards > n_params:
        raise ValueError(f"shards must be at most the number of parameters ({n_params}), got {config.shards}")


def run_ps(
    config: PSConfig, client: Client, on_update: OnUpdate | None, replica: Callable[..., Any], *, asynchronous: bool
) -> Result:
    """Start the shards, run one replica task per worker, watch the server, and return the trace and summary.

    A replica whose worker dies is dropped in asynchronous runs (the trace gets a worker_lost row) and stops a
    synchronous run (its barrier cannot complete). A shard whose worker dies is restored from its checkpoint when
    checkpoint_every > 0, else the run stops with ShardUnavailable naming the shard.
    """
    problem = get_problem(config.problem)
    check_replicas_and_shards(config, client, problem.init_params.size)
    with quiet_released_shards():
        return _run_ps(config, client, on_update, replica, problem, asynchronous)


def _run_ps(
    config: PSConfig, client: Client, on_update: OnUpdate | None, replica: Callable[..., Any], problem: Problem,
    asynchronous: bool,
) -> Result:
    server = ShardedServer.start(
        client, problem.init_params, config.shards, config.optimizer, config.lr, config.checkpoint_every,
        timeout_s=config.timeout_s, dc_lambda=config.dc_lambda,
    )
    try:
        watch = ServerWatch(on_update, server, problem, config.eval_every)
        t = time.perf_counter()
        try:
            watch.evaluate(force=True)  # the starting point of the loss curves
        except StopRequested:
            pass
        results, stopped = run_live(
            client, replica, [(server, config)] * config.replicas, watch,
            on_worker_lost="drop" if asynchronous else "raise",
        )
        wall = time.perf_counter() - t
        params, versions = server.pull()
        metrics = problem.evaluate(params)
        try:
            if watch.last_eval != min(versions):
                watch.record(
                    event="eval", loss=metrics["train_loss"], version_applied=min(versions), step=min(versions),
                    updates=min(versions), **metrics,
                )
        except StopRequested:
            stopped = True
        trace = watch.frame()
        lost = watch.lost_updates(trace)
        if watch.restores:
            for info in watch.restores:
                rows = (trace.event == "shard_restored") & (trace.shard == info["shard"])
                rows &= trace.shard_epoch == info["epoch"]
                trace.loc[rows, "lost_updates"] = info["lost_updates"]
    finally:
        server.close()
    summary = summarise(trace, wall, min(versions), metrics)
    summary.update(
        replicas_lost=int((trace.event == "worker_lost").sum()), shards_restored=len(watch.restores),
        lost_updates=lost, replica_steps=int(sum(r["steps"] for r in results if r is not None)),
    )
    return Result(config, trace, summary, params, stopped)


def summarise(trace: pd.DataFrame, wall_s: float, updates: int, metrics: dict[str, float]) -> dict[str, Any]:
    """Throughput, staleness and traffic figures from a parameter-server trace."""
    pushes = trace[trace.event == "push"]
    applied = pushes[pushes.get("applied", pd.Series(True, index=pushes.index)).astype(bool)]
    stale = applied.staleness.to_numpy(dtype=float)
    return {
        "wall_s": wall_s,
        "updates": int(updates),
        "updates_per_s": ratio(updates, wall_s),
        "mean_staleness": stat(stale, how="mean"),
        "max_staleness": int(np.max(stale)) if len(stale) else 0,
        "duplicates": int(len(pushes) - len(applied)),
        "mbytes_moved": float(trace.bytes_sent.sum()) / 1e6,
        "final_train_loss": metrics["train_loss"],
        "final_test_accuracy": metrics["test_accuracy"],
    }
