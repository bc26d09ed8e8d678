"""Synchronous data parallelism: every step each worker computes a gradient on its shard, the driver averages.

The average is weighted by the rows each worker used, so with full shards it is exactly the full-batch gradient.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from distributed import Client

from ..config import check_int
from ..memory import wait_futures
from ..models import loss_and_grad
from ..problem import ProblemSpec, get_problem
from ..runtime.ranks.live import pick_workers
from ..sampling import batch_indices
from ..trace import OnUpdate, Result, StopRequested, TraceRecorder, stat
from .sequential import SGDConfig


@dataclass(frozen=True)
class DataParallelConfig(SGDConfig):
    """Synchronous data-parallel SGD: `workers` shards, each contributing batch_size rows per step."""

    steps: int = 200
    workers: int = 2

    def validate(self) -> None:
        super().validate()
        check_int("workers", self.workers, 1, 64)


def shard_gradient(
    spec: ProblemSpec, params: np.ndarray, rank: int, world: int, batch_size: int, step: int, seed: int
) -> tuple[float, np.ndarray, int, float]:
    """(loss, gradient, rows used, compute seconds) of rank's minibatch at `step`; runs on a worker."""
    t = time.perf_counter()
    shard = get_problem(spec).train_shard(rank, world)
    idx = batch_indices(shard.n_samples, batch_size, step, seed + rank)
    loss, grad = loss_and_grad(get_problem(spec).model, params, shard.X[idx], shard.y[idx])
    return loss, grad, len(idx), time.perf_counter() - t


def averaged_gradient(parts: list[tuple[float, np.ndarray, int, float]]) -> tuple[float, np.ndarray]:
    """Row-weighted mean of per-worker (loss, gradient) pairs: equals the gradient over the union of batches."""
    rows = np.array([p[2] for p in parts], dtype=np.float64)
    weights = rows / rows.sum()
    grad = sum(w * p[1].astype(np.float64) for w, p in zip(weights, parts, strict=True))
    loss = float(sum(w * p[0] for w, p in zip(weights, parts, strict=True)))
    return loss, np.asarray(grad, dtype=np.float32)


def run_data_parallel(config: DataParallelConfig, client: Client, on_update: OnUpdate | None = None) -> Result:
    """Synchronous data-parallel SGD on the cluster; the trace has one event per worker gradient and per step."""
    recorder = TraceRecorder(on_update)
    problem = get_problem(config.problem)
    workers = pick_workers(client, config.workers)
    w = problem.init_params.copy()
    stopped, t_run = False, time.perf_counter()
    step_times = []
    try:
        for step in range(config.steps):
            t_step = time.perf_counter()
            futures = [
                client.submit(
                    shard_gradient, config.problem, w, rank, config.workers, config.batch_size, step, config.seed,
                    workers=[workers[rank]], allow_other_workers=True, pure=False,
                )
                for rank in range(config.workers)
            ]
            wait_futures(client, futures, 60.0, f"step {step} of data-parallel SGD")
            parts = client.gather(futures)
            loss, grad = averaged_gradient(parts)
            w -= np.float32(config.lr) * grad
            step_times.append(time.perf_counter() - t_step)
            for rank, (wloss, g, _rows, compute_s) in enumerate(parts):
                recorder.record(
                    worker=rank, step=step, event="gradient", loss=wloss, version_read=step,
                    version_applied=step + 1, bytes_sent=w.nbytes + g.nbytes, compute_s=compute_s,
                )
            recorder.record(step=step, event="update", loss=loss, version_read=step, version_applied=step + 1)
            if (step + 1) % config.eval_every == 0 or step + 1 == config.steps:
                metrics = problem.evaluate(w)
                recorder.record(step=step, event="eval", loss=metrics["train_loss"], version_applied=step + 1, **metrics)
    except StopRequested:
        stopped = True
    trace = recorder.frame()
    evals = trace[trace.event == "eval"]
    summary = {
        "wall_s": time.perf_counter() - t_run,
        "steps": len(step_times),
        "median_step_ms": stat(step_times) * 1e3,
        "final_train_loss": stat(evals, "train_loss", "last"),
        "final_test_accuracy": stat(evals, "test_accuracy", "last"),
    }
    return Result(config, trace, summary, w, stopped)
