"""Synchronous SGD on the cluster, with optional backup workers (Chen et al. 2016) and 1-bit compression.

N + b long-running worker tasks each compute a gradient at the current version, add their injected straggler
delay, and push it to the SyncCoordinator actor; the step is applied the moment the N-th gradient arrives. With
backups, a worker still in its injected delay when the step completes cancels (its gradient is never sent, the
event is "cancelled"); one that arrives late is "discarded". Each step waits for the N fastest, not the slowest.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from distributed import Client

from ..config import check_bool, check_int
from ..models import loss_and_grad
from ..problem import get_problem
from ..runtime.clusters.workers import get_workers
from ..runtime.ranks.live import WorkerContext, pick_workers, run_live
from ..sampling import batch_indices
from ..trace import OnUpdate, Result, stat
from .actors import SyncCoordinator
from .onebit import OneBitCompressor
from .settings import MAX_WORKERS, ChapterConfig, EvalRecorder, summarize
from .step_server import StepServer, record_push, record_step


@dataclass(frozen=True)
class SyncConfig(ChapterConfig):
    """Synchronous SGD: `workers` gradients per step from `workers + backups` processes; optional 1-bit SGD."""

    backups: int = 0
    compression: bool = False
    error_feedback: bool = True

    def validate(self) -> None:
        check_int("workers", self.workers, 1, MAX_WORKERS)  # first: the backups' range depends on it
        check_int("backups", self.backups, 0, self.workers)
        super().validate()
        check_bool("compression", self.compression)
        check_bool("error_feedback", self.error_feedback)

    @property
    def world(self) -> int:
        return self.workers + self.backups


def sync_worker(ctx: WorkerContext, config: SyncConfig, coord: Any) -> int:
    """One rank of synchronous SGD: read w_t, compute a minibatch gradient, push it. The coordinator makes step t
    from the first N gradients of the N + b ranks; a rank still straggling then drops its gradient unsent.
    Returns the number of gradients this rank sent."""
    problem = get_problem(config.problem)
    shard = problem.train_shard(ctx.rank, config.world)
    delays = config.delay_model()
    compressor = OneBitCompressor(problem.init_params.size, config.error_feedback) if config.compression else None
    server = StepServer(coord, ctx, config.timeout_s)
    step = server.join(ctx.rank)  # w_0, once every rank has joined
    sent = 0
    while step.running and not server.stopping():
        t_begin, t0 = time.time() - ctx.t0, time.perf_counter()
        idx = batch_indices(shard.n_samples, config.batch_size, step.version, config.seed + ctx.rank)
        loss, grad = loss_and_grad(problem.model, step.w, shard.X[idx], shard.y[idx])
        compute_s = time.perf_counter() - t0
        # an injected straggler delay; with backups, cut short once the step completed without this rank
        delay, too_late = server.straggle(step.version, delays.delay(ctx.rank, step.version), config.backups > 0)
        t1 = time.perf_counter()
        if too_late:  # the first N gradients made step t: this one is cancelled, never sent
            reply = server.skip(step.version)
        else:
            payload = compressor.encode(grad) if compressor is not None else grad
            reply = server.push(ctx.rank, step.version, payload, len(idx), loss, compute_s + delay)
            sent += 1
        record_push(ctx, step.version, reply, loss, grad, t_begin, compute_s, delay, time.perf_counter() - t1)
        record_step(ctx, reply, config.steps, config.eval_every)
        step = reply.next  # w_{t+1}, or the end of the run
    return sent


def run_sync(config: SyncConfig, client: Client, on_update: OnUpdate | None = None) -> Result:
    """Run synchronous SGD (with backups / 1-bit if configured) on the cluster and return its trace."""
    get_workers(client, config.world, policy="present", instead="use fewer workers/backups")
    problem = get_problem(config.problem)
    recorder = EvalRecorder(problem, on_update)
    t_start = time.perf_counter()
    coord_future = client.submit(  # pinned next to rank 0, so a run's placement is reproducible
        SyncCoordinator, problem.init_params, config.workers, config.world, config.lr, config.steps,
        actor=True, pure=False, workers=pick_workers(client, 1), allow_other_workers=False,
    )
    coord = coord_future.result(timeout=config.timeout_s)
    try:
        _, stopped = run_live(
            client, sync_worker, [(config, coord)] * config.world, recorder,
            timeout_s=config.timeout_s + config.steps * (0.5 + 20 * config.severity),
        )
        params, step_rows, logs = coord.report().result(timeout=30)
    finally:
        try:
            coord.stop_all().result(timeout=5)
        except Exception:  # the actor's worker may be gone already; nothing left to wake then
            pass
        coord_future.release()
    recorder.on_update = None  # the run is over: the per-step logs go into the trace without callbacks
    for log in logs:
        if log.arrivals:
            recorder.record(
                step=log.version, event="step_log", arrivals=",".join(map(str, log.arrivals)),
                aggregated=",".join(map(str, log.aggregated)), discarded=",".join(map(str, log.discarded)),
            )
    trace = recorder.frame()
    step_s = np.array([r["step_s"] for r in step_rows[1:]])  # step 0 includes start-up
    busy_s = np.array([r["slowest_busy_s"] for r in step_rows[1:]])
    grads = trace[trace.event.isin(["gradient", "discarded", "cancelled"])]
    summary = summarize(trace, t_start, {
        "steps": len(step_rows),
        "mean_step_ms": stat(step_s, how="mean") * 1e3,
        "median_overhead_ms": stat(step_s - busy_s) * 1e3,
        "discarded": int((trace.event == "discarded").sum()),
        "cancelled": int((trace.event == "cancelled").sum()),
        "bytes_sent": int(grads.bytes_sent.sum()) if len(grads) else 0,
        "uplink_bytes": int(grads.uplink_bytes.sum()) if len(grads) else 0,
        "raw_uplink_bytes": int(grads.raw_uplink_bytes.sum()) if len(grads) else 0,
    })
    return Result(config, trace, summary, params, stopped)
