"""Synchronous data-parallel SGD whose gradients are summed by an allreduce we choose: hand-written or library.

Every rank computes a gradient on its own shard, then all ranks allreduce one vector
[rows * gradient, rows * loss, rows, stop flag]; dividing by the summed rows gives the row-weighted mean
gradient on every rank at once, so no driver or server touches the parameters, and a Stop reaches all ranks
in the same step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
from distributed import Client

from ..config import check_choice, check_int, check_timeout
from ..models import loss_and_grad
from ..problem import TrainingConfig, get_problem
from ..runtime.ranks.comm import Comm
from ..runtime.ranks.group import DEVICES
from ..runtime.ranks.group_run import run_group
from ..runtime.ranks.live import WorkerContext
from ..sampling import batch_indices
from ..trace import OnUpdate, Result, stat
from .algorithms import check_algorithm, get_allreduce


@dataclass(frozen=True)
class AllreduceSGDConfig(TrainingConfig):
    """Data-parallel SGD over `workers` ranks, averaging gradients with `allreduce` (ring, library, ...)."""

    workers: int = 2
    allreduce: str = "ring"
    device: str = "auto"
    timeout_s: float = 30.0
    run_timeout_s: float = 600.0

    def validate(self) -> None:
        super().validate()
        check_int("workers", self.workers, 1, 16)
        check_algorithm("allreduce", self.allreduce)
        check_choice("device", self.device, DEVICES)
        check_timeout("timeout_s", self.timeout_s)
        check_timeout("run_timeout_s", self.run_timeout_s, 86400.0)


def _sgd_rank(ctx: WorkerContext, comm: Comm, config: AllreduceSGDConfig) -> np.ndarray:
    """One rank's training loop: local gradient, allreduce, identical update on every rank."""
    problem = get_problem(config.problem)
    shard = problem.train_shard(comm.rank, comm.world)
    allreduce = get_allreduce(config.allreduce)
    w = problem.init_params.astype(np.float32, copy=True)
    for step in range(config.steps):
        t = time.perf_counter()
        idx = batch_indices(shard.n_samples, config.batch_size, step, config.seed + comm.rank)
        loss, grad = loss_and_grad(problem.model, w, shard.X[idx], shard.y[idx])
        rows = float(len(idx))
        tail = np.array([loss * rows, rows, 1.0 if ctx.should_stop() else 0.0], dtype=np.float32)
        message = torch.from_numpy(np.concatenate([grad * np.float32(rows), tail])).to(comm.device)
        t_comm = time.perf_counter()
        total = allreduce(comm, message).cpu().numpy()
        comm_s = time.perf_counter() - t_comm
        sent = comm.bytes_sent()
        comm.take_log()
        w -= np.float32(config.lr) * (total[:-3] / total[-2])
        ctx.emit(step=step, event="allreduce", bytes_sent=sent, comm_s=comm_s, compute_s=t_comm - t,
                 version_read=step, version_applied=step + 1)
        if comm.rank == 0:
            ctx.emit(step=step, event="update", loss=float(total[-3] / total[-2]), version_read=step,
                     version_applied=step + 1)
            if (step + 1) % config.eval_every == 0 or step + 1 == config.steps:
                metrics = problem.evaluate(w)
                ctx.emit(step=step, event="eval", loss=metrics["train_loss"], version_applied=step + 1, **metrics)
        if total[-1] > 0:
            break
    return w


def run_allreduce_sgd(config: AllreduceSGDConfig, client: Client, on_update: OnUpdate | None = None) -> Result:
    """Data-parallel SGD with gradients averaged by config.allreduce; final params are rank 0's."""
    run = run_group(client, config.workers, _sgd_rank, (config,), on_update, device=config.device,
                    timeout_s=config.timeout_s, run_timeout_s=config.run_timeout_s)
    trace, done = run.trace, run.done
    updates = trace[trace.event == "update"]
    stopped = run.stopped or len(updates) < config.steps
    evals = trace[trace.event == "eval"]
    comm = trace[trace.event == "allreduce"]
    summary = {
        "wall_s": run.wall_s,
        "steps": len(updates),
        "backend": run.spec.backend,
        "final_train_loss": stat(evals, "train_loss", "last"),
        "final_test_accuracy": stat(evals, "test_accuracy", "last"),
        "median_comm_ms": stat(comm, "comm_s") * 1e3,
        "max_rank_divergence": float(max(np.max(np.abs(p - done[0]), initial=0.0) for p in done)) if done else 0.0,
    }
    return Result(config, trace, summary, done[0] if done else None, stopped)
