"""Simulated allreduce timings: a central server (naive) queueing at its port, against recursive doubling and the ring.

The naive allreduce is simulated message by message: N-1 ranks send their vectors to rank 0 at once and queue at
its port, rank 0 sends the sum back one rank at a time. The ring and recursive doubling (a butterfly, not a tree)
run chapter 05's schedules: every rank takes part in each step with links in parallel, so a step lasts
alpha + (largest message) / bandwidth. Each repeat is one "allreduce" event with the columns chapter 05's trace
uses (slowest_seconds, nbytes, algorithm).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import simpy

from ..collectives.algorithms import chunk_sizes
from ..collectives.cost_model import bus_bandwidth, schedule_steps
from ..trace import stat
from .engine import SimRun
from .network import ITEMSIZE, FifoLink, ServerPorts


class AllreduceSim(SimRun):
    """`steps` repeats of one allreduce of `elements` float32 over `workers` ranks."""

    def __init__(self, config: Any, on_update: Any) -> None:
        super().__init__(config, on_update)
        self.times: list[float] = []
        self.env.process(self.repeats())

    def repeats(self) -> Generator[simpy.Event, Any, None]:
        """Run the repeats back to back, one trace event each."""
        cfg, env = self.config, self.env
        n, k = cfg.workers, self.elements
        for rep in range(cfg.steps):
            t0 = env.now
            if cfg.comm == "naive":
                yield from self.naive(n)
                sent = (n - 1) * self.param_bytes  # rank 0 sends the sum to everyone
            else:
                steps = schedule_steps(cfg.comm, n, k, ITEMSIZE)
                for nbytes in steps:
                    yield env.timeout(self.net.message_s(nbytes))
                per_step = max(chunk_sizes(k, n)) * ITEMSIZE if cfg.comm == "ring" else self.param_bytes
                sent = len(steps) * per_step
            seconds = float(env.now - t0)
            self.times.append(seconds)
            self.trace.record(
                worker=0, step=rep, event="allreduce", algorithm=cfg.comm, world=n, nbytes=self.param_bytes,
                slowest_seconds=seconds, bytes_sent=sent if n > 1 else 0,
            )

    def naive(self, n: int) -> Generator[simpy.Event, Any, None]:
        """Gather to rank 0 through its queued port, then rank 0 sends the sum back through its outbound port."""
        if n <= 1:
            return
        ports = ServerPorts(self.env, self.net, 1)
        arrivals = [self.env.process(self._send(ports.inbound[0])) for _ in range(n - 1)]
        yield self.env.all_of(arrivals)
        sends = [self.env.process(self._send(ports.outbound[0])) for _ in range(n - 1)]
        yield self.env.all_of(sends)

    def _send(self, link: FifoLink) -> Generator[simpy.Event, Any, None]:
        done = link.book(self.param_bytes, self.env.now)
        if done > self.env.now:
            yield self.env.timeout(done - self.env.now)

    def finish(self) -> dict[str, float]:
        """Median time and bus bandwidth, as chapter 05's run_allreduce reports them."""
        median = stat(self.times)
        return {
            "sim_time_s": float(self.env.now),
            "world": self.config.workers,
            "median_ms": median * 1e3,
            "busbw_GBps": bus_bandwidth(self.param_bytes, self.config.workers, median) / 1e9,
        }
