"""The alpha-beta network: a message of m bytes takes alpha + m / bandwidth seconds on a link.

A server's network port is a FIFO link: messages that reach it while it is busy queue behind each other, which is
exactly why a central server's time grows with the number of workers. Collectives use chapter 05's schedules
(how many sequential steps, how many bytes in the largest message of each step), so the simulated allreduce and
the chapter's cost model are one and the same.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass

import simpy

from ..collectives.cost_model import schedule_steps
from ..trace import ratio

ITEMSIZE = 4  # float32


@dataclass(frozen=True)
class AlphaBetaNet:
    """Latency alpha_s per message and bandwidth in bytes/second (None: infinitely fast)."""

    alpha_s: float
    bandwidth_Bps: float | None

    def message_s(self, nbytes: float) -> float:
        """Seconds one message of nbytes occupies a link."""
        if nbytes <= 0 and self.alpha_s == 0:
            return 0.0
        return self.alpha_s + (nbytes / self.bandwidth_Bps if self.bandwidth_Bps else 0.0)

    def collective_s(self, comm: str, n: int, elements: int) -> float:
        """Seconds of one allreduce of `elements` float32 over n ranks: chapter 05's schedule, step by step."""
        return sum(self.message_s(b) for b in schedule_steps(comm, n, elements, ITEMSIZE))


def ring_closed_form(alpha_s: float, bandwidth_Bps: float, n: int, nbytes: float) -> float:
    """Patarasuk & Yuan's ring: 2(N-1) steps of one K/N chunk each, 2(N-1)(alpha + K/(N beta))."""
    return 2 * (n - 1) * (alpha_s + nbytes / (n * bandwidth_Bps)) if n > 1 else 0.0


class FifoLink:
    """One network port served in arrival order: a capacity-1 queue kept as the time it becomes free.

    Equivalent to a simpy.Resource of capacity 1 held for each message's time, but a message costs one timeout
    instead of three events, which keeps 1000 workers fast. busy_s and messages count its load.
    """

    def __init__(self, env: simpy.Environment, net: AlphaBetaNet) -> None:
        self.env, self.net = env, net
        self.free_at = 0.0
        self.busy_s = 0.0
        self.messages = 0

    def book(self, nbytes: float, at: float) -> float:
        """Queue a message of nbytes that reaches the port at time `at`; returns when it is delivered."""
        hold = self.net.message_s(nbytes)
        self.free_at = max(at, self.free_at) + hold
        self.busy_s += hold
        self.messages += 1
        return self.free_at


class ServerPorts:
    """A (possibly sharded) parameter server's ports: one inbound and one outbound FIFO link per shard.

    A worker's message of K bytes is split evenly over the shards, which receive their parts in parallel; it is
    delivered when the slowest shard has it.
    """

    def __init__(self, env: simpy.Environment, net: AlphaBetaNet, shards: int) -> None:
        self.env = env
        self.inbound = [FifoLink(env, net) for _ in range(shards)]
        self.outbound = [FifoLink(env, net) for _ in range(shards)]

    def _move(self, links: list[FifoLink], nbytes: float) -> Generator[simpy.Event, None, float]:
        t0 = self.env.now
        part = nbytes / len(links)
        done_at = max(link.book(part, t0) for link in links)  # lands when the last shard has its part
        if done_at > t0:
            yield self.env.timeout(done_at - t0)
        return done_at - t0

    def busiest_fraction(self, elapsed_s: float) -> float:
        """Largest fraction of elapsed_s any one server port spent sending or receiving (1.0: saturated)."""
        busy = max(link.busy_s for link in self.inbound + self.outbound)
        return ratio(busy, elapsed_s)

    def push(self, nbytes: float) -> Generator[simpy.Event, None, float]:
        """A worker sends nbytes to the server (a gradient)."""
        return (yield from self._move(self.inbound, nbytes))

    def pull(self, nbytes: float) -> Generator[simpy.Event, None, float]:
        """The server sends nbytes to a worker (the parameters)."""
        return (yield from self._move(self.outbound, nbytes))
