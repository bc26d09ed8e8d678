"""Simulated synchronous SGD with stragglers and backup workers (Chen et al. 2016), at up to 1000 workers.

Each of the workers + backups processes pulls the current parameters, computes (compute time + injected straggler
delay), and pushes its gradient. Chapter 04's SyncRound decides, exactly as on the cluster, that a step takes the
first `workers` gradients and discards the rest. Backups follow the cluster's rule too: a worker still in its
injected delay when the step completes is cancelled (its gradient is never sent; event "cancelled") and starts on
the next version; one whose gradient arrives late is "discarded". So every step starts all N + b workers afresh,
and its time is the N-th smallest of their N + b compute-plus-delay times (plus communication).
comm="naive" sends everything through a central server whose ports queue the messages; comm="ring"/"doubling"
averages the gradients with an allreduce among the `workers` ranks. The server's rule (optimizer) is applied to
the step's mean gradient with no delay, as chapter 03's synchronous parameter server does.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import numpy as np
import simpy

from ..ps.optimizers import make_optimizer
from ..sgd import averaged_gradient
from ..syncasync.onebit import HEADER_BYTES, OneBitCompressor
from ..syncasync.schedule import SyncRound
from ..trace import stat
from .engine import SimRun
from .network import ServerPorts


class SyncSim(SimRun):
    """The synchronous loop as SimPy processes sharing one SyncRound."""

    def __init__(self, config: Any, on_update: Any) -> None:
        super().__init__(config, on_update)
        self.round = SyncRound(config.workers, config.world)
        self.ports = ServerPorts(self.env, self.net, config.shards) if config.comm == "naive" else None
        self.published = 0  # newest version whose parameters the workers can fetch
        self.new_version: simpy.Event = self.env.event()
        self.step_closed: simpy.Event = self.env.event()  # fires when a step has its gradients (backups cancel)
        self.cancelled = 0
        self.rule = make_optimizer(config.rule, self.elements, config.dc_lambda) if self.real else None
        self.parts: list[tuple[float, np.ndarray | None, int, float]] = []
        self.step_rows: list[dict[str, Any]] = []
        self.t_version = 0.0
        self.w_published = self.w
        self.allreduce_s = self.net.collective_s(config.comm, config.workers, self.elements) if self.ports is None else 0.0
        onebit = HEADER_BYTES + (self.elements + 7) // 8
        self.uplink_bytes = onebit if config.compression else self.param_bytes
        self.compressors = {} if config.compression and self.real else None
        for rank in range(config.world):
            self.env.process(self.worker(rank))

    @property
    def finished(self) -> bool:
        return self.published >= self.config.steps

    def worker(self, rank: int) -> Generator[simpy.Event, Any, None]:
        """One rank: pull, compute, push, then wait for a newer version; stops after `steps` versions."""
        cfg, env = self.config, self.env
        while not self.finished:
            version, w = self.published, self.w_published
            t_pull = env.now
            if self.ports is not None:
                yield from self.ports.pull(self.param_bytes)
            t_begin = env.now
            compute, delay = self.delays.compute(rank, version), self.delays.injected(rank, version)
            loss, grad, rows = self.grads(rank, version, w) if self.grads is not None else (np.nan, None, cfg.batch_size)
            if grad is not None and self.compressors is not None:
                comp = self.compressors.setdefault(rank, OneBitCompressor(grad.size, True))
                grad = comp.encode(grad).decode()
            cancelled = False
            if cfg.backups > 0 and delay > 0:  # the cluster's rule: an injected delay ends when the step does
                if compute > 0:
                    yield env.timeout(compute)
                t_delay = env.now
                if self.round.version <= version:
                    yield env.any_of([env.timeout(delay), self.step_closed])
                cancelled = self.round.version > version
                if cancelled:
                    delay = float(env.now - t_delay)
            elif compute + delay > 0:
                yield env.timeout(compute + delay)
            if cancelled:
                self.cancelled += 1
                self.trace.record(
                    worker=rank, step=version, event="cancelled", loss=loss, version_read=version,
                    version_applied=-1, injected_delay=delay, bytes_sent=self.param_bytes if self.ports else 0,
                    uplink_bytes=0, t_begin=t_begin, compute_s=compute, comm_s=t_begin - t_pull, wait_s=0.0,
                )
                while self.published <= version and not self.finished:
                    yield self.new_version
                continue
            t_push = env.now
            if self.ports is not None:
                yield from self.ports.push(self.uplink_bytes)
            verdict = self.round.arrive(rank, version)
            if verdict == "aggregated":
                self.parts.append((loss, grad, rows, compute + delay))
            self.trace.record(
                worker=rank, step=version, event="gradient" if verdict == "aggregated" else "discarded", loss=loss,
                version_read=version, version_applied=version + 1 if verdict == "aggregated" else -1,
                injected_delay=delay, bytes_sent=self.uplink_bytes + (self.param_bytes if self.ports else 0),
                uplink_bytes=self.uplink_bytes, t_begin=t_begin, compute_s=compute,
                comm_s=(t_begin - t_pull) + (env.now - t_push), wait_s=0.0,
            )
            if verdict == "aggregated" and self.round.complete:
                self.complete()
            while self.published <= version and not self.finished:
                yield self.new_version

    def complete(self) -> None:
        """The step has its `workers` gradients: apply the mean, close the round, publish after comm time."""
        cfg = self.config
        loss = float("nan")
        if self.real:
            loss, grad = averaged_gradient(self.parts)  # type: ignore[arg-type]
            self.w = self.rule.apply(self.w, grad, cfg.lr)
        log = self.round.advance()
        closed, self.step_closed = self.step_closed, self.env.event()
        closed.succeed()
        busy = max(p[3] for p in self.parts)
        self.parts = []
        self.env.process(self.publish(log.version, log.aggregated, loss, busy, self.w))

    def publish(
        self, version: int, aggregated: list[int], loss: float, busy: float, w: np.ndarray | None
    ) -> Generator[simpy.Event, Any, None]:
        """After the server (or the allreduce) is done, version + 1 becomes fetchable; record the update."""
        delay = self.config.server_s + self.allreduce_s
        if delay > 0:
            yield self.env.timeout(delay)
        now = self.env.now
        row = {"version": version, "step_s": now - self.t_version, "slowest_busy_s": busy}
        self.step_rows.append(row)
        self.t_version = now
        self.published, self.w_published = version + 1, w
        event, self.new_version = self.new_version, self.env.event()
        event.succeed()
        snap = {"params": w} if self.snapshot_due(version + 1, self.config.steps) else {}
        self.trace.record(
            worker=-1, step=version, event="update", loss=loss, version_read=version, version_applied=version + 1,
            step_s=row["step_s"], slowest_busy_s=busy, aggregated=",".join(map(str, aggregated)), **snap,
        )

    def finish(self) -> dict[str, float]:
        """Per-step logs into the trace; summary figures like chapter 04's run_sync."""
        self.trace.on_update = None
        for log in self.round.logs:
            if log.arrivals:
                self.trace.record(
                    time=float(self.env.now), step=log.version, event="step_log",
                    arrivals=",".join(map(str, log.arrivals)), aggregated=",".join(map(str, log.aggregated)),
                    discarded=",".join(map(str, log.discarded)),
                )
        rows = self.step_rows[1:] if len(self.step_rows) > 1 else self.step_rows
        step_s = np.array([r["step_s"] for r in rows])
        busy_s = np.array([r["slowest_busy_s"] for r in rows])
        return {
            "steps": len(self.step_rows),
            "sim_time_s": float(self.env.now),
            "mean_step_ms": stat(step_s, how="mean") * 1e3,
            "median_step_ms": stat(step_s) * 1e3,
            "median_overhead_ms": stat(step_s - busy_s) * 1e3,
            "discarded": int(sum(len(log.discarded) for log in self.round.logs)),
            "cancelled": self.cancelled,
            "server_port_busy": self.ports.busiest_fraction(self.env.now) if self.ports else float("nan"),
        }
