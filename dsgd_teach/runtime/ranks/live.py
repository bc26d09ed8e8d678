"""Long-running tasks pinned to workers, streaming events to the driver, stoppable, and safe when a worker dies.

A worker function receives a WorkerContext: `ctx.emit(...)` sends a trace event (through dask's event topics,
batched and cheap), `ctx.should_stop()` polls the run's stop flag. The driver side, run_live(), records events as
they arrive (calling on_update), turns StopRequested into the stop flag, and notices a worker that has left.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack
from distributed import Client, Event, Future, get_worker

from ...memory import check_workers_memory
from ...trace import StopRequested, TraceRecorder
from ..clusters.cluster import worker_addresses
from .rank_watch import RankInterrupted, RankWatch, WorkerLost

__all__ = ["EventStream", "RankInterrupted", "WorkerContext", "WorkerLost", "pick_workers", "run_live"]

@dataclass
class WorkerContext:
    """What a worker function needs to report progress and notice a stop request."""

    topic: str
    stop_name: str
    rank: int
    world: int
    t0: float
    check_every_s: float = 0.25
    flush_every_s: float = 0.1
    _last_check: float = field(default=0.0, repr=False)
    _stopped: bool = field(default=False, repr=False)
    _asking: concurrent.futures.Future[bool] | None = field(default=None, repr=False)
    _pending: list[dict[str, Any]] = field(default_factory=list, repr=False)
    _last_flush: float = field(default=0.0, repr=False)

    def emit(self, **event: Any) -> None:
        """Queue one trace event for the driver (worker and time are filled in); sent in batches.

        One message per flush_every_s instead of one per event: each message costs the worker, the scheduler and
        the driver CPU time, which on a small machine is taken from the experiment being measured.
        """
        event.setdefault("time", time.time() - self.t0)
        # dask stamps a "worker" key (the address) on event dicts; the rank travels under its own key.
        event["rank"] = event.pop("worker", self.rank)
        self._pending.append(event)
        if time.monotonic() - self._last_flush >= self.flush_every_s:
            self.flush()

    def flush(self, last: bool = False) -> None:
        """Send the queued events now; run_live's wrapper sends the rank's last batch, marked last, at its end."""
        self._last_flush = time.monotonic()
        if self._pending or last:
            batch, self._pending = self._pending, []
            packed = msgpack.packb(batch, default=_plain)  # one bytes blob: dask moves it without walking it
            get_worker().log_event(self.topic, {"packed": packed, "last": self.rank if last else None})

    def should_stop(self) -> bool:
        """True once the driver asked the run to stop; never waits.

        At most every check_every_s seconds it asks the scheduler in the background (on the worker's event loop)
        and answers from the last reply, so a rank's step is never held up by a round trip to the scheduler.
        """
        if self._stopped:
            return True
        if self._asking is not None and self._asking.done():
            asked, self._asking = self._asking, None
            self._stopped = bool(asked.result())  # a lost scheduler raises here, loudly
        now = time.monotonic()
        if self._asking is None and not self._stopped and now - self._last_check >= self.check_every_s:
            self._last_check = now
            worker = get_worker()
            self._asking = asyncio.run_coroutine_threadsafe(
                worker.scheduler.event_is_set(name=self.stop_name), worker.loop.asyncio_loop)
        return self._stopped


def _plain(value: Any) -> Any:
    """A numpy or torch value in an event (scalar or array), as the Python number or list msgpack can pack."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (tuple, set, frozenset)):
        return list(value)
    raise TypeError(f"a trace event value must be a number, string, list or dict, not {type(value).__name__}")


def _run_rank(fn: Callable[..., Any], ctx: WorkerContext, *args: Any) -> Any:
    """fn(ctx, *args) on the worker, then send whatever events it left queued."""
    try:
        return fn(ctx, *args)
    finally:
        ctx.flush(last=True)


class EventStream:
    """Driver-side subscription to a run's event topic; events wait in a thread-safe queue."""

    def __init__(self, client: Client, topic: str) -> None:
        self.client, self.topic = client, topic
        self.queue: queue.Queue[list[dict[str, Any]]] = queue.Queue()
        self.finished: set[int] = set()  # ranks whose last batch has arrived

    def _handler(self, item: tuple[float, Any]) -> None:
        batch = msgpack.unpackb(item[1]["packed"], raw=False, strict_map_key=False)
        for event in batch:
            event["worker"] = event.pop("rank", -1)
        self.queue.put(batch)  # one put per batch: a run sends tens of thousands of events
        if item[1].get("last") is not None:
            self.finished.add(item[1]["last"])

    def wait_finished(self, ranks: set[int], timeout_s: float) -> None:
        """Wait (bounded) until the last batch of every rank in `ranks` has arrived: events travel apart from
        task results, so a finished task's events may still be on their way."""
        deadline = time.monotonic() + timeout_s
        while not ranks <= self.finished and time.monotonic() < deadline:
            time.sleep(0.005)

    def __enter__(self) -> EventStream:
        self.client.subscribe_topic(self.topic, self._handler)
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.unsubscribe_topic(self.topic)

    def drain(self) -> list[dict[str, Any]]:
        """All events received so far."""
        out: list[dict[str, Any]] = []
        while True:
            try:
                out.extend(self.queue.get_nowait())
            except queue.Empty:
                return out


def pick_workers(client: Client, world: int) -> list[str]:
    """Worker address for each rank: rank r runs on the (r mod n)-th worker (refuses paused workers)."""
    addresses = worker_addresses(client)
    if not addresses:
        raise WorkerLost("the cluster has no workers")
    chosen = [addresses[r % len(addresses)] for r in range(world)]
    check_workers_memory(client, chosen)
    return chosen


def run_live(
    client: Client,
    fn: Callable[..., Any],
    args_per_rank: Sequence[tuple[Any, ...]],
    recorder: TraceRecorder,
    *,
    on_worker_lost: str = "raise",
    timeout_s: float | None = None,
    poll_s: float = 0.05,
    addresses: list[str] | None = None,
) -> tuple[list[Any], bool]:
    """Run fn(ctx, *args) for each rank on its own worker; returns (results, stopped).

    A rank whose worker dies raises WorkerLost (on_worker_lost="raise") or is recorded as a "worker_lost"
    event and its result is None ("drop"); with "drop", a rank that raised RankInterrupted because a peer's
    worker died returns that exception as its result (without a death it is an error as any other). A
    StopRequested from on_update sets the stop flag; the tasks then finish their current step and return.
    Exceeding timeout_s raises TimeoutError. A rank queued on a worker that dask's memory monitor keeps paused
    raises WorkerMemoryError within PAUSE_GRACE_S. Never hangs. addresses names the worker of each rank (default:
    pick_workers).
    """
    world = len(args_per_rank)
    addresses = list(addresses) if addresses else pick_workers(client, world)
    if len(addresses) != world:
        raise ValueError(f"need one worker address per rank ({world}), got {len(addresses)}")
    check_workers_memory(client, addresses)
    run_id = uuid.uuid4().hex[:10]
    topic, stop_name = f"dsgd-events-{run_id}", f"dsgd-stop-{run_id}"
    stop_event = Event(stop_name, client=client)
    stopped = False
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    with EventStream(client, topic) as stream:
        futures: list[Future | None] = [  # one long task per rank, pinned to its worker
            client.submit(_run_rank, fn, WorkerContext(topic, stop_name, rank, world, recorder.t0), *args,
                          key=f"{getattr(fn, '__name__', 'task')}-{run_id}-rank{rank}", workers=[addresses[rank]],
                          allow_other_workers=False, pure=False, retries=0)
            for rank, args in enumerate(args_per_rank)
        ]
        watch = RankWatch(client, futures, addresses, recorder, on_worker_lost)
        try:
            while watch.pending:
                try:
                    recorder.extend(stream.drain())  # the ranks' events into the trace (calls on_update)
                except StopRequested:  # on_update asked to stop: the ranks finish their step and return
                    stopped = True
                    stop_event.set()
                watch.collect_finished()  # results of the ranks that finished; a failed rank's cause raised
                watch.watch_workers()  # ranks whose worker died or is kept paused by its memory monitor
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"run did not finish within {timeout_s:.0f} s")
                if watch.pending:
                    time.sleep(poll_s)
            stream.wait_finished({r for r in range(world) if futures[r] is not None}, timeout_s=10.0)
            recorder.extend(stream.drain())
        except StopRequested:
            stopped = True
        finally:
            for fut in futures:
                if fut is not None and not fut.done():
                    fut.cancel()
            stop_event.set()
    return watch.results, stopped
