"""Local SGD (periodic parameter averaging): H local steps on each replica, then an allreduce of the parameters.

Each rank runs plain minibatch SGD on its own shard. Every `sync_every` (H) steps all ranks allreduce one vector
[rows * w, rows, rows * loss, stop flag] with chapter 05's ring (or another allreduce), so every rank leaves
with the sample-weighted mean of the replicas. With H = 1 that is exactly synchronous data-parallel SGD: the
mean of w - lr g_r is w - lr times the mean gradient. Before each average every rank traces its distance to the
mean (the replicas' spread) and the bytes it sent.

When a replica's worker dies, the others' allreduce fails. Each survivor then gives up with the last average it
completed (identical on every rank that completed it), and the driver forms a smaller group on the surviving
workers that resumes from the newest of those averages, the training set re-split among fewer shards (runtime/
elastic.py, after torchrun's elastic training). The trace records it as "worker_lost" and "regroup" events.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from distributed import Client

from ..collectives.algorithms import ALGORITHMS
from ..models import loss_and_grad
from ..problem import get_problem
from ..runtime.ranks.comm import Comm
from ..runtime.ranks.elastic import run_elastic
from ..runtime.ranks.live import RankInterrupted, WorkerContext
from ..sampling import batch_indices
from ..trace import OnUpdate, Result, TraceRecorder, stat
from .config import LocalSGDConfig


def average_parameters(comm: Comm, allreduce: str, w: np.ndarray, rows: float, loss_sum: float,
                       stop: bool) -> tuple[np.ndarray, float, float, bool]:
    """Allreduce [rows*w, rows, loss_sum, stop]: (row-weighted mean of w, total rows, mean loss, anyone stops)."""
    tail = np.array([rows, loss_sum, 1.0 if stop else 0.0], dtype=np.float32)
    message = torch.from_numpy(np.concatenate([w * np.float32(rows), tail])).to(comm.device)
    total = ALGORITHMS[allreduce](comm, message).cpu().numpy()
    return total[:-3] / total[-3], float(total[-3]), float(total[-2] / total[-3]), bool(total[-1] > 0)


@dataclass(frozen=True)
class Checkpoint:
    """Where local SGD can resume: the parameters of an average, the step after it, and the next round."""

    params: np.ndarray
    step: int
    round: int

    def __repr__(self) -> str:
        return f"Checkpoint(step={self.step}, round={self.round}, {self.params.size} parameters)"


def _local_sgd_rank(ctx: WorkerContext, comm: Comm, config: LocalSGDConfig, start: Checkpoint) -> np.ndarray:
    """One replica from `start`: H local steps, then the averaging allreduce; rank 0 evaluates the averaged model."""
    problem = get_problem(config.problem)
    shard = problem.train_shard(comm.rank, comm.world)
    w = start.params.astype(np.float32, copy=True)
    rows, loss_sum, last_eval, rnd = 0.0, 0.0, start.step, start.round
    last_average = start
    for step in range(start.step, config.steps):
        t = time.perf_counter()
        idx = batch_indices(shard.n_samples, config.batch_size, step, config.seed + comm.rank)
        loss, grad = loss_and_grad(problem.model, w, shard.X[idx], shard.y[idx])
        w -= np.float32(config.lr) * grad
        rows, loss_sum = rows + len(idx), loss_sum + loss * len(idx)
        ctx.emit(step=step, event="local_step", loss=loss, round=rnd, compute_s=time.perf_counter() - t)
        if (step + 1) % config.sync_every and step + 1 < config.steps:
            continue
        t_comm = time.perf_counter()
        before = w
        failure = ""
        try:
            w, _, mean_loss, stop = average_parameters(comm, config.allreduce, w, rows, loss_sum, ctx.should_stop())
        except (TimeoutError, RuntimeError) as exc:
            if config.on_worker_lost == "raise":
                raise
            failure = f"rank {comm.rank}: the average of round {rnd} failed: {exc}"
        if failure:  # raised outside the handler, so no traceback keeps the failed sends (and the group's sockets)
            raise RankInterrupted(failure, last_average)
        last_average = Checkpoint(w.copy(), step + 1, rnd + 1)
        comm_s = time.perf_counter() - t_comm
        ctx.emit(step=step, event="average", round=rnd, bytes_sent=comm.bytes_sent(), comm_s=comm_s,
                 spread=float(np.linalg.norm(before - w)), version_read=rnd, version_applied=rnd + 1)
        comm.take_log()
        if comm.rank == 0:
            ctx.emit(step=step, event="update", round=rnd, loss=mean_loss, version_read=rnd, version_applied=rnd + 1)
            if step + 1 - last_eval >= config.eval_every or step + 1 == config.steps or stop:
                last_eval = step + 1
                metrics = problem.evaluate(w)
                ctx.emit(step=step, event="eval", round=rnd, loss=metrics["train_loss"], version_applied=rnd + 1,
                         **metrics)
        rows, loss_sum, rnd = 0.0, 0.0, rnd + 1
        if stop:
            break
    return w


def run_local_sgd(config: LocalSGDConfig, client: Client, on_update: OnUpdate | None = None) -> Result:
    """Local SGD on `workers` ranks of one process group; final parameters are rank 0's (all ranks agree).

    With on_worker_lost="regroup", the ranks left after a worker dies carry on from the last average.
    """
    t0 = time.perf_counter()
    recorder = TraceRecorder(on_update)
    start = Checkpoint(get_problem(config.problem).init_params.astype(np.float32), 0, 0)
    done, stopped = run_elastic(client, config.workers, _local_sgd_rank, (config,), start, recorder,
                                timeout_s=config.timeout_s, run_timeout_s=config.run_timeout_s,
                                regroup=config.on_worker_lost == "regroup", what="the local-SGD run",
                                describe=lambda c: {"step": c.step, "round": c.round})
    trace = recorder.frame()
    averages = trace[trace.event == "average"]
    evals = trace[trace.event == "eval"]
    local = trace[trace.event == "local_step"]
    stopped = stopped or not len(local) or int(local.step.max()) + 1 < config.steps
    summary = {
        "wall_s": time.perf_counter() - t0,
        "local_steps": int(local.step.max() + 1) if len(local) else 0,
        "rounds": int(averages["round"].max() + 1) if len(averages) else 0,
        "bytes_sent": int(averages.bytes_sent.sum()),
        "mean_spread": stat(averages, "spread", "mean"),
        "final_train_loss": stat(evals, "train_loss", "last"),
        "final_test_accuracy": stat(evals, "test_accuracy", "last"),
        "regroups": int((trace.event == "regroup").sum()),
    }
    return Result(config, trace, summary, done[0] if done else None, stopped)


def local_sgd_curve(trace: pd.DataFrame) -> pd.DataFrame:
    """One row per evaluation of a local-SGD run: local steps, cumulative bytes (all ranks), seconds since the first
    local step, loss and accuracy."""
    averages = trace[trace.event == "average"]
    per_round = averages.groupby("round").bytes_sent.sum().cumsum()
    evals = trace[trace.event == "eval"].copy()
    evals["updates"] = evals.step + 1
    evals["bytes"] = per_round.reindex(evals["round"]).to_numpy()
    evals["time"] = evals.time - trace[trace.event == "local_step"].time.min()  # from the first step, not set-up
    return evals[["updates", "bytes", "time", "train_loss", "test_accuracy"]].reset_index(drop=True)


def bytes_to_accuracy(result: Result, target: float) -> float:
    """Bytes all ranks had sent when an evaluation first reached target test accuracy; NaN if none did."""
    curve = local_sgd_curve(result.trace)
    hit = curve[curve.test_accuracy >= target]
    return stat(hit, "bytes", "first")
