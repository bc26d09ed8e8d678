"""The driver's watch over a running run's ranks: each result as its rank finishes, and a clear error (or, with
on_worker_lost="drop", a recorded loss) when a rank fails, its worker dies, or dask's memory monitor keeps its
worker paused before the rank could start. `live.run_live` calls it between reads of the ranks' events."""

from __future__ import annotations

import time
from typing import Any

from distributed import Client, Future

from ...memory import memory_error, paused_workers, scheduler_workers
from ...trace import TraceRecorder
from ..clusters.cluster import worker_addresses

#: How long a rank's worker may stay paused, with the rank's task not started there, before the run gives up.
PAUSE_GRACE_S = 2.0
#: How long one fetch of a finished rank's result may take before the run checks that its worker is still alive.
RESULT_WAIT_S = 5.0
#: How often the cluster's membership and paused workers are checked.
MEMBERSHIP_EVERY_S = 0.5
#: What a rank's error says when it failed only because a peer's connection closed (the peer failed first).
AFTER_A_PEER = ("Connection closed by peer", "Connection reset by peer")


class WorkerLost(RuntimeError):
    """A worker running part of an experiment died or left the cluster."""


class RankInterrupted(RuntimeError):
    """A rank gave up because a peer failed; `state` is what the run can resume from without it."""

    def __init__(self, message: str, state: Any = None) -> None:
        super().__init__(message, state)
        self.state = state

    def __str__(self) -> str:
        return str(self.args[0])

    def __repr__(self) -> str:
        return f"RankInterrupted({self.args[0]!r}, {self.state!r})"


class RankWatch:
    """Results and failures of one run's ranks: `pending` until each has finished or been dropped."""

    def __init__(self, client: Client, futures: list[Future | None], addresses: list[str], recorder: TraceRecorder,
                 on_worker_lost: str) -> None:
        self.client, self.futures, self.addresses = client, futures, addresses
        self.recorder, self.on_worker_lost = recorder, on_worker_lost
        self.results: list[Any] = [None] * len(futures)
        self.pending = set(range(len(futures)))
        self._last_check = 0.0
        self._paused_since: float | None = None

    def collect_finished(self) -> None:
        """Take the result of every rank that has finished; raise the cause of a rank that failed."""
        for rank in sorted(self.pending):
            fut = self.futures[rank]
            if fut is None or not fut.done():
                continue
            self.pending.discard(rank)
            if fut.status == "error":
                self._failed(rank, fut.exception())
                continue
            try:
                self.results[rank] = fut.result(timeout=RESULT_WAIT_S)
            except TimeoutError:  # its worker died before the result was fetched: dask would wait forever for it;
                self.pending.add(rank)  # the membership check drops it or raises
                self._last_check = 0.0

    def _failed(self, rank: int, exc: BaseException) -> None:
        """A rank raised: keep it as its result (interrupted by a peer's death, with "drop"), or raise its cause."""
        interrupted = self.on_worker_lost == "drop" and isinstance(exc, RankInterrupted)
        others = set(range(len(self.futures))) - {rank}
        dead = self._dead_rank(others) if self.on_worker_lost == "raise" or interrupted else None
        if interrupted and dead is not None:
            self.results[rank] = exc  # it stopped because a peer died: the caller may resume
            return
        if dead is not None:  # a neighbour's death is the cause; the rank's error only follows it
            raise WorkerLost(f"worker {self.addresses[dead]} running rank {dead} died; rank {rank} then failed: "
                             f"{type(exc).__name__}: {exc}") from exc
        first, cause = first_cause(self.futures, rank, exc)
        after = f" (rank {rank} then lost its connection to it)" if first != rank else ""
        raise RuntimeError(f"rank {first} on {self.addresses[first]} failed: {type(cause).__name__}: "
                           f"{cause}{after}") from cause

    def watch_workers(self) -> None:
        """Every MEMBERSHIP_EVERY_S: drop (or raise for) ranks whose worker left, and fail ranks a paused worker
        keeps from starting for PAUSE_GRACE_S."""
        now = time.monotonic()
        if not self.pending or now - self._last_check <= MEMBERSHIP_EVERY_S:
            return
        self._last_check = now
        workers = scheduler_workers(self.client)
        paused = paused_workers(workers, [self.addresses[r] for r in self.pending])
        self._paused_since = (self._paused_since or now) if paused else None
        if self._paused_since is not None and now - self._paused_since >= PAUSE_GRACE_S:
            starved = self._starved_ranks(paused)
            if starved:
                raise memory_error(workers, sorted({self.addresses[r] for r in starved}),
                                   getattr(self.client, "_owned_cluster", None) is not None,
                                   f"rank(s) {starved} cannot start")
        for rank in sorted(self.pending):
            if self.addresses[rank] not in workers:
                self._lost(rank)

    def _lost(self, rank: int) -> None:
        """The rank's worker left the cluster: raise, or record the loss and go on without it ("drop")."""
        self.pending.discard(rank)
        fut = self.futures[rank]
        if fut is not None:
            fut.cancel()
        self.futures[rank] = None
        if self.on_worker_lost == "raise":
            raise WorkerLost(f"worker {self.addresses[rank]} running rank {rank} died; the run cannot go on without "
                             "it (see the trace for what it had done)")
        self.recorder.record(worker=rank, event="worker_lost")

    def _starved_ranks(self, paused: list[str]) -> list[int]:
        """Pending ranks queued on a paused worker that has not started their task (it never will while paused)."""
        starved = []
        for rank in sorted(self.pending):
            fut = self.futures[rank]
            if fut is None or self.addresses[rank] not in paused:
                continue
            running = self.client.run(_executing_keys, workers=[self.addresses[rank]]).get(self.addresses[rank], [])
            if str(fut.key) not in running:
                starved.append(rank)
        return starved

    def _dead_rank(self, ranks: set[int], grace_s: float = 2.0) -> int | None:
        """The first of `ranks` whose worker has left the cluster, waiting up to grace_s for the scheduler to notice."""
        deadline = time.monotonic() + grace_s
        while True:
            alive = set(worker_addresses(self.client))
            gone = sorted(r for r in ranks if self.addresses[r] not in alive)
            if gone or time.monotonic() > deadline:
                return gone[0] if gone else None
            time.sleep(0.1)


def _executing_keys(dask_worker: Any) -> list[str]:
    """Keys of the tasks a worker is running right now (run on the worker through client.run)."""
    return [str(ts.key) for ts in dask_worker.state.executing]


def first_cause(futures: list[Future | None], rank: int, exc: BaseException,
                wait_s: float = 2.0) -> tuple[int, BaseException]:
    """The rank whose error caused the others': where `rank` only lost its connection to a peer, a peer's own error
    (waited for up to wait_s), else rank's."""
    if not any(text in str(exc) for text in AFTER_A_PEER):
        return rank, exc
    deadline = time.monotonic() + wait_s
    while True:
        for other, fut in enumerate(futures):
            if other != rank and fut is not None and fut.done() and fut.status == "error":
                cause = fut.exception()
                if not any(text in str(cause) for text in AFTER_A_PEER):
                    return other, cause
        if time.monotonic() > deadline:
            return rank, exc
        time.sleep(0.05)
