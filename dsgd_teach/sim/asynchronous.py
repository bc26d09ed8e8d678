"""Simulated asynchronous SGD: staleness, the server's update rules (chapter 03's optimizers.py), bounded staleness.

Every worker pulls, computes and pushes on its own clock; the server applies each gradient the moment the
staleness gate lets it. Decisions go through chapter 04's StalenessGate, and blocked workers are re-examined in
rank order after every change, the rule of chapter 04's simulate_async, so on a scripted interleaving the simulator
and the chapter agree gradient for gradient. Traffic goes through the (sharded) server's queued ports. The server
applies each gradient with the config's rule (SGD, AdaGrad, AdaRevision, DC-ASGD, staleness-aware), the same code
as on the cluster, given the staleness this simulated server observed.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import numpy as np
import simpy

from ..ps.optimizers import MAX_READS, make_optimizer, staleness_aware_scale
from ..syncasync.schedule import StalenessGate
from ..trace import ratio, stat
from .engine import SimRun
from .network import ServerPorts


class GateKeeper:
    """StalenessGate plus the workers waiting at it; `sweep` admits whoever may go, lowest rank first."""

    def __init__(self, env: simpy.Environment, bound: int | None, updates: int, on_read: Any, on_write: Any) -> None:
        self.env, self.gate, self.updates = env, StalenessGate(bound), updates
        self.on_read, self.on_write = on_read, on_write
        self.pending: dict[int, tuple[str, simpy.Event]] = {}
        self.closed = False

    def request(self, worker: int, kind: str) -> simpy.Event:
        """Ask to 'read' or 'write'; the event's value is the version read / the write receipt, None when done."""
        event = self.env.event()
        if self.closed:
            return event.succeed(None)
        self.pending[worker] = (kind, event)
        self.sweep()
        return event

    def sweep(self) -> None:
        """Admit every waiting read and write the gate allows, repeatedly, in rank order."""
        progressed = True
        while progressed and not self.closed:
            progressed = False
            for worker in sorted(self.pending):
                kind, event = self.pending[worker]
                if kind == "read" and self.gate.can_read(worker):
                    del self.pending[worker]
                    version = self.gate.read(worker)
                    self.on_read(worker, version)
                    event.succeed(version)
                    progressed = True
                elif kind == "write" and self.gate.can_write(worker):
                    read, applied, staleness = self.gate.write(worker)
                    next_read = self.env.event()
                    self.pending[worker] = ("read", next_read)  # a worker reads again straight after writing
                    event.succeed((read, applied, staleness, next_read))
                    self.on_write(worker, read, applied, staleness)
                    progressed = True
                    if applied >= self.updates:
                        self.close()
                        break

    def close(self) -> None:
        """The last update landed: everyone still waiting is told to stop."""
        self.closed = True
        for worker, (_, event) in list(self.pending.items()):
            if not event.triggered:
                event.succeed(None)
            self.gate.leave(worker)
        self.pending.clear()


class AsyncSim(SimRun):
    """Asynchronous SGD as SimPy processes around one parameter server."""

    def __init__(self, config: Any, on_update: Any) -> None:
        super().__init__(config, on_update)
        self.ports = ServerPorts(self.env, self.net, config.shards)
        self.keeper = GateKeeper(self.env, config.staleness_bound, config.steps, self.read, self.apply)
        self.waiting: dict[int, dict[str, Any]] = {}  # worker -> its gradient and timings, until applied
        self.held: dict[int, np.ndarray | None] = {}  # worker -> the parameters it read
        reads = max(MAX_READS, 2 * config.workers)  # every worker may hold a read of its own version
        self.rule = make_optimizer(config.rule, self.elements, config.dc_lambda, reads) if self.real else None
        for rank in range(config.workers):
            self.env.process(self.worker(rank))

    def worker(self, rank: int) -> Generator[simpy.Event, Any, None]:
        """One rank: read (gate), pull, compute, push, write (gate); k counts its own gradients."""
        env, k = self.env, 0
        version = yield self.keeper.request(rank, "read")
        while version is not None:
            w = self.held.pop(rank)
            t0 = env.now
            yield from self.ports.pull(self.param_bytes)
            t_begin = env.now
            compute, delay = self.delays.compute(rank, k), self.delays.injected(rank, k)
            loss, grad = (self.grads(rank, k, w)[:2]) if self.grads is not None else (np.nan, None)
            if compute + delay > 0:
                yield env.timeout(compute + delay)
            t_push = env.now
            yield from self.ports.push(self.param_bytes)
            self.waiting[rank] = {
                "k": k, "loss": loss, "grad": grad, "delay": delay, "compute": compute, "t_begin": t_begin,
                "comm_s": (t_begin - t0) + (env.now - t_push), "t_ask": env.now,
            }
            receipt = yield self.keeper.request(rank, "write")
            if receipt is None:
                return
            k += 1
            version = yield receipt[3]

    def read(self, rank: int, version: int) -> None:
        """The gate admitted rank's read: it holds the parameters as they are at this instant."""
        self.held[rank] = self.w
        if self.rule is not None:
            self.rule.read(version, self.w)

    def apply(self, rank: int, read: int, applied: int, staleness: int) -> None:
        """The gate admitted rank's write: apply it with the server's rule and record the push."""
        cfg = self.config
        job = self.waiting.pop(rank)
        scale = staleness_aware_scale(staleness) if cfg.rule == "staleness_aware" else 1.0
        if job["grad"] is not None:
            self.w = self.rule.apply(self.w, job["grad"], cfg.lr, read, applied - 1)
        snap = {"params": self.w} if self.snapshot_due(applied, cfg.steps) else {}
        self.trace.record(
            worker=rank, step=job["k"], event="push", loss=job["loss"], version_read=read, version_applied=applied,
            staleness=staleness, bytes_sent=2 * self.param_bytes, injected_delay=job["delay"], lr_scale=scale,
            t_begin=job["t_begin"], compute_s=job["compute"], wait_s=float(self.env.now - job["t_ask"]),
            comm_s=job["comm_s"], **snap,
        )

    def finish(self) -> dict[str, float]:
        """Summary figures like chapter 04's run_async, plus the steady-state mean staleness."""
        trace = self.trace.frame()
        pushes = trace[trace.event == "push"] if len(trace) else trace
        stale = pushes.staleness.to_numpy(dtype=float) if len(pushes) else np.array([])
        steady = stale[self.config.workers:] if stale.size > self.config.workers else stale
        now = float(self.env.now)
        return {
            "updates": int(self.keeper.gate.version),
            "sim_time_s": now,
            "updates_per_s": ratio(self.keeper.gate.version, now),
            "mean_staleness": stat(stale, how="mean"),
            "steady_mean_staleness": stat(steady, how="mean"),
            "max_staleness": int(stale.max()) if stale.size else 0,
            "server_port_busy": self.ports.busiest_fraction(now),
        }
