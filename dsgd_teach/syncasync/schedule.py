"""Pure scheduling rules, shared by the cluster actors and the tests: no clocks, no network, only decisions.

SyncRound decides which gradients a synchronous step aggregates (the first `needed` arrivals for the current
version; anything else is discarded and logged). StalenessGate decides when an asynchronous worker may read or
write so that no gradient is ever applied more than `bound` versions after it was read.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class StepLog:
    """What happened in one synchronous step: arrival order, aggregated and discarded ranks."""

    version: int
    arrivals: list[int] = field(default_factory=list)
    aggregated: list[int] = field(default_factory=list)
    discarded: list[int] = field(default_factory=list)


class SyncRound:
    """First-`needed`-of-`world` aggregation: a step completes the moment its `needed`-th gradient arrives.

    A gradient computed from an older version (it arrived after its step completed) is discarded and logged
    against that version; it is never mixed into a later step.
    """

    def __init__(self, needed: int, world: int) -> None:
        if not 1 <= needed <= world:
            raise ValueError(f"needed must be in [1, world={world}], got {needed}")
        self.needed, self.world = needed, world
        self.version = 0
        self.logs: list[StepLog] = [StepLog(0)]

    def arrive(self, rank: int, version: int) -> str:
        """Log rank's gradient computed at `version`: 'aggregated' or 'discarded'."""
        if not 0 <= rank < self.world:
            raise ValueError(f"rank must be in [0, {self.world}), got {rank}")
        if not 0 <= version <= self.version:
            raise ValueError(f"version {version} is not in [0, {self.version}] (no gradient from the future)")
        log = self.logs[version]
        log.arrivals.append(rank)
        if version < self.version or rank in log.aggregated:
            log.discarded.append(rank)
            return "discarded"
        log.aggregated.append(rank)
        return "aggregated"

    @property
    def complete(self) -> bool:
        """True when the current step has all the gradients it needs."""
        return len(self.logs[self.version].aggregated) >= self.needed

    def advance(self) -> StepLog:
        """Close the complete current step and open the next; returns the closed step's log."""
        if not self.complete:
            raise RuntimeError(f"step {self.version} has {len(self.logs[self.version].aggregated)} of {self.needed}")
        done = self.logs[self.version]
        self.version += 1
        self.logs.append(StepLog(self.version))
        return done


class StalenessGate:
    """Bounded staleness for asynchronous SGD: every gradient is applied at most `bound` versions after its read.

    Workers in flight (read, not yet written) are kept oldest first. Invariant: if they all wrote oldest first,
    the i-th (1-based) would have staleness (version - read_i) + (i - 1) <= bound. A read is admitted when the
    newcomer keeps the invariant (at most bound+1 in flight); a write by the i-th is admitted when it keeps it
    for the older ones. The oldest may always write, so the gate never deadlocks. bound=None: plain async.
    """

    def __init__(self, bound: int | None) -> None:
        if bound is not None and (isinstance(bound, bool) or not isinstance(bound, int) or bound < 0):
            raise ValueError(f"bound must be None or an integer >= 0, got {bound!r}")
        self.bound = bound
        self.version = 0
        self.inflight: dict[int, int] = {}  # worker -> version read (insertion order = age)

    def can_read(self, worker: int) -> bool:
        """May worker read the parameters now?"""
        if worker in self.inflight:
            raise ValueError(f"worker {worker} already holds a read at version {self.inflight[worker]}")
        return self.bound is None or len(self.inflight) <= self.bound

    def read(self, worker: int) -> int:
        """Record worker's read; returns the version read."""
        if not self.can_read(worker):
            raise RuntimeError(f"worker {worker} may not read now ({len(self.inflight)} in flight)")
        self.inflight[worker] = self.version
        return self.version

    def can_write(self, worker: int) -> bool:
        """May worker apply its gradient now?"""
        if worker not in self.inflight:
            raise ValueError(f"worker {worker} writes without a read")
        if self.bound is None:
            return True
        for position, (other, read) in enumerate(self.inflight.items(), start=1):
            if other == worker:
                return True
            if self.version - read + position > self.bound:
                return False
        return True  # pragma: no cover - worker is always found

    def write(self, worker: int) -> tuple[int, int, int]:
        """Apply worker's gradient: returns (version_read, version_applied, staleness)."""
        if not self.can_write(worker):
            raise RuntimeError(f"worker {worker} may not write now")
        read = self.inflight.pop(worker)
        staleness = self.version - read
        self.version += 1
        return read, self.version, staleness

    def leave(self, worker: int) -> None:
        """Forget worker's outstanding read (it stopped without writing)."""
        self.inflight.pop(worker, None)


def simulate_async(durations: Sequence[Sequence[float]], bound: int | None) -> list[tuple[int, int, int, int]]:
    """Discrete-event run of async SGD: worker w's k-th gradient takes durations[w][k] time units.

    Reads and writes go through StalenessGate; a blocked worker retries whenever the gate changes. Returns the
    writes in order as (worker, version_read, version_applied, staleness). Raises RuntimeError on deadlock.
    """
    gate = StalenessGate(bound)
    todo = [list(d) for d in durations]
    state = {w: "read" for w in range(len(todo)) if todo[w]}  # waiting to read / waiting to write
    events: list[tuple[float, int, int]] = []  # (time, tie-break, worker) when a computation finishes
    writes: list[tuple[int, int, int, int]] = []
    now, counter = 0.0, 0
    while state:
        progressed = True
        while progressed:  # let every unblocked worker act at the current time, lowest rank first
            progressed = False
            for w in sorted(state):
                if state[w] == "read" and gate.can_read(w):
                    gate.read(w)
                    state[w] = "busy"
                    heapq.heappush(events, (now + todo[w].pop(0), counter, w))
                    counter += 1
                    progressed = True
                elif state[w] == "write" and gate.can_write(w):
                    writes.append((w, *gate.write(w)))
                    state[w] = "read" if todo[w] else "done"
                    if state[w] == "done":
                        del state[w]
                    progressed = True
        if not state:
            break
        if not events:
            raise RuntimeError(f"deadlock: workers {sorted(state)} blocked with nothing running")
        now, _, w = heapq.heappop(events)
        state[w] = "write"
    return writes
