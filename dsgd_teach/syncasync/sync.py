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
from ..runtime import ActorCalls
from ..runtime.live import WorkerContext, pick_workers, run_live
from ..runtime.workers import require_workers
from ..sampling import batch_indices
from ..trace import OnUpdate, Result
from .actors import SyncCoordinator
from .onebit import OneBitCompressor, raw_nbytes
from .settings import MAX_WORKERS, ChapterConfig, EvalRecorder, summarize


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


def _sync_worker(ctx: WorkerContext, config: SyncConfig, coord: Any) -> int:
    """One rank's loop: pull, compute, inject delay, push; returns the number of gradients it sent."""
    problem = get_problem(config.problem)
    shard = problem.train_shard(ctx.rank, config.world)
    delays = config.delay_model()
    compressor = OneBitCompressor(problem.init_params.size, config.error_feedback) if config.compression else None
    server = ActorCalls(coord, ctx, config.timeout_s, packed=("push",), what="the step coordinator")
    server("join", ctx.rank)  # start together: nobody races ahead while the others load
    status, version, w = server("pull", -1)
    sent = 0
    while status == "run" and not server.stopping():
        t_begin = time.time() - ctx.t0
        t0 = time.perf_counter()
        idx = batch_indices(shard.n_samples, config.batch_size, version, config.seed + ctx.rank)
        loss, grad = loss_and_grad(problem.model, w, shard.X[idx], shard.y[idx])
        compute_s = time.perf_counter() - t0
        delay = delays.delay(ctx.rank, version)
        cancelled = False
        if delay > 0 and config.backups > 0:  # injected straggler delay, cut short once the step is done
            t_delay = time.perf_counter()
            cancelled = server("wait_past", version, delay, extra_s=delay) > version
            delay = time.perf_counter() - t_delay if cancelled else max(delay, time.perf_counter() - t_delay)
        elif delay > 0:
            time.sleep(delay)  # injected straggler delay, recorded as injected_delay
        t1 = time.perf_counter()
        if cancelled:  # the step completed without us: drop the gradient unsent, start on the new version
            verdict, waited, nbytes, completed = "cancelled", 0.0, 0, None
            status, new_version, new_w = "pending", version, None
        else:
            payload = compressor.encode(grad) if compressor is not None else grad
            verdict, waited, nbytes, completed, status, new_version, new_w = server(
                "push", ctx.rank, version, payload, len(idx), loss, compute_s + delay)
        if status == "pending":  # wait for the step to complete (the coordinator answers a slice at a time)
            status, new_version, new_w = server("pull", version)
            waited += server.last_s
        sent += not cancelled
        exchange_s = time.perf_counter() - t1
        aggregated = verdict == "aggregated"
        ctx.emit(
            step=version, event="gradient" if aggregated else verdict, loss=loss, version_read=version,
            version_applied=version + 1 if aggregated else -1, injected_delay=delay,
            bytes_sent=nbytes + (new_w.nbytes if new_w is not None else 0), uplink_bytes=nbytes,
            raw_uplink_bytes=raw_nbytes(grad.size),
            t_begin=t_begin, compute_s=compute_s, wait_s=min(waited, exchange_s),
            comm_s=max(0.0, exchange_s - waited),
        )
        if completed is not None and new_w is not None:
            v = completed["version"]
            snapshot = (v + 1) % config.eval_every == 0 or v + 1 == config.steps
            ctx.emit(
                worker=-1, step=v, event="update", loss=completed["loss"], version_read=v, version_applied=v + 1,
                step_s=completed["step_s"], slowest_busy_s=completed["slowest_busy_s"],
                aggregated=",".join(map(str, completed["aggregated"])),
                **({"params": new_w.tolist()} if snapshot else {}),
            )
        if status == "run":
            version, w = new_version, new_w
    return sent


def run_sync(config: SyncConfig, client: Client, on_update: OnUpdate | None = None) -> Result:
    """Run synchronous SGD (with backups / 1-bit if configured) on the cluster and return its trace."""
    require_workers(client, config.world, "this run", "use fewer workers/backups")
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
            client, _sync_worker, [(config, coord)] * config.world, recorder,
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
        "mean_step_ms": float(step_s.mean() * 1e3) if step_s.size else float("nan"),
        "median_overhead_ms": float(np.median(step_s - busy_s) * 1e3) if step_s.size else float("nan"),
        "discarded": int((trace.event == "discarded").sum()),
        "cancelled": int((trace.event == "cancelled").sum()),
        "bytes_sent": int(grads.bytes_sent.sum()) if len(grads) else 0,
        "uplink_bytes": int(grads.uplink_bytes.sum()) if len(grads) else 0,
        "raw_uplink_bytes": int(grads.raw_uplink_bytes.sum()) if len(grads) else 0,
    })
    return Result(config, trace, summary, params, stopped)
