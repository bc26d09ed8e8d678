"""Minibatch SGD on one worker: the sequential baseline, and the oracle later chapters are tested against."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from distributed import Client

from ..models import loss_and_grad
from ..problem import ProblemSpec, TrainingConfig, get_problem
from ..runtime.ranks.live import WorkerContext, run_live
from ..sampling import batch_indices
from ..trace import OnUpdate, Result, TraceRecorder, stat


@dataclass(frozen=True)
class SGDConfig(TrainingConfig):
    """Sequential minibatch SGD; batch_size >= the training set size gives full-batch gradient descent."""

    steps: int = 300


StepCallback = Callable[[int, float, np.ndarray], bool]


def sgd_steps(
    spec: ProblemSpec,
    lr: float,
    batch_size: int,
    steps: int,
    seed: int,
    *,
    rank: int = 0,
    world: int = 1,
    params: np.ndarray | None = None,
    callback: StepCallback | None = None,
) -> np.ndarray:
    """Run `steps` SGD steps on rank's shard from params (default: the model's init) and return the result.

    Batches come from batch_indices(seed + rank); callback(step, loss, params) may return True to stop early.
    """
    problem = get_problem(spec)
    shard = problem.train_shard(rank, world)
    w = (problem.init_params if params is None else params).astype(np.float32, copy=True)
    for step in range(steps):
        idx = batch_indices(shard.n_samples, batch_size, step, seed + rank)
        loss, grad = loss_and_grad(problem.model, w, shard.X[idx], shard.y[idx])
        w -= np.float32(lr) * grad
        if callback is not None and callback(step, loss, w):
            break
    return w


def _sgd_task(ctx: WorkerContext, config: SGDConfig) -> np.ndarray:
    """Worker side of run_sgd: the loop, emitting an event per step and an evaluation every eval_every."""
    problem = get_problem(config.problem)

    def report(step: int, loss: float, w: np.ndarray) -> bool:
        ctx.emit(step=step, event="update", loss=loss, version_read=step, version_applied=step + 1)
        if (step + 1) % config.eval_every == 0 or step + 1 == config.steps:
            metrics = problem.evaluate(w)
            ctx.emit(step=step, event="eval", loss=metrics["train_loss"], version_applied=step + 1, **metrics)
        return ctx.should_stop()

    return sgd_steps(config.problem, config.lr, config.batch_size, config.steps, config.seed, callback=report)


def run_sgd(config: SGDConfig, client: Client, on_update: OnUpdate | None = None) -> Result:
    """Run sequential SGD as one task on one worker, streaming its events; returns the trace and final params."""
    recorder = TraceRecorder(on_update)
    t = time.perf_counter()
    (params,), stopped = run_live(client, _sgd_task, [(config,)], recorder)
    trace = recorder.frame()
    evals = trace[trace.event == "eval"]
    summary = {
        "wall_s": time.perf_counter() - t,
        "steps": int((trace.event == "update").sum()),
        "final_train_loss": stat(evals, "train_loss", "last"),
        "final_test_accuracy": stat(evals, "test_accuracy", "last"),
    }
    return Result(config, trace, summary, params, stopped)
