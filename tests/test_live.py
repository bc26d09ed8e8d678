"""Long-running worker tasks: events stream back, Stop stops, a dead worker gives a clear error, not a hang."""

from __future__ import annotations

import os
import threading
import time

import pytest

from dsgd_teach.runtime.ranks.live import WorkerLost, run_live
from dsgd_teach.trace import StopRequested, TraceRecorder


def _count(ctx, n):
    for i in range(n):
        ctx.emit(step=i, event="tick", loss=float(i))
        if ctx.should_stop():
            return i
        time.sleep(0.002)  # pacing so events interleave; not a stand-in for work
    return n


def test_events_arrive_in_order_per_rank(client):
    recorder = TraceRecorder()
    results, stopped = run_live(client, _count, [(30,), (20,)], recorder, timeout_s=60)
    assert results == [30, 20] and not stopped
    trace = recorder.frame()
    for rank, n in ((0, 30), (1, 20)):
        steps = list(trace[trace.worker == rank].step)
        assert steps == list(range(n))


def _burst(ctx, n):
    for i in range(n):
        ctx.emit(step=i, event="tick")
    return n


def test_events_queued_when_a_task_returns_all_arrive_batched(client):
    # 2000 events emitted in a few milliseconds, then the task returns at once: all of them but the first go
    # out in the final batch, which run_live must wait for instead of hoping it came in time.
    seen: list[int] = []
    recorder = TraceRecorder(lambda event: seen.append(event["step"]))
    results, _ = run_live(client, _burst, [(2000,), (2000,)], recorder, timeout_s=60)
    trace = recorder.frame()
    assert results == [2000, 2000]
    for rank in (0, 1):
        assert list(trace[trace.worker == rank].step) == list(range(2000))
    assert len(seen) == 4000


def test_stop_requested_stops_the_tasks(client):
    def on_update(event):
        if event["step"] >= 5:
            raise StopRequested

    recorder = TraceRecorder(on_update)
    t = time.monotonic()
    results, stopped = run_live(client, _count, [(100_000,), (100_000,)], recorder, timeout_s=60)
    assert stopped
    assert time.monotonic() - t < 50
    assert all(r is None or r < 100_000 for r in results)


def _die_or_count(ctx, n):
    if ctx.rank == 1:
        time.sleep(0.3)
        os._exit(1)
    return _count(ctx, n)


@pytest.mark.timeout(120)
def test_dead_worker_raises_a_clear_error(fresh_client):
    recorder = TraceRecorder()
    with pytest.raises(WorkerLost, match="rank 1"):
        run_live(fresh_client, _die_or_count, [(100_000,), (100_000,)], recorder, timeout_s=90)


@pytest.mark.timeout(120)
def test_dead_worker_can_be_survived(fresh_client):
    recorder = TraceRecorder()
    results, _ = run_live(
        fresh_client, _die_or_count, [(400,), (400,)], recorder, on_worker_lost="drop", timeout_s=90
    )
    assert results[0] == 400 and results[1] is None
    assert "worker_lost" in set(recorder.frame().event)
    assert not [t for t in threading.enumerate() if t.name.startswith("dsgd")]


def _quick_or_count(ctx, n):
    return "done" if ctx.rank == 0 else _count(ctx, n)


@pytest.mark.timeout(120)
def test_a_result_lost_with_its_worker_before_it_was_fetched_gives_a_clear_error(fresh_client, monkeypatch):
    from distributed import Future

    from dsgd_teach.memory import scheduler_workers

    pids = fresh_client.run(os.getpid)
    original = Future.result

    def fetch_after_the_worker_died(self, timeout=None):  # the race: rank 0 finished, then its worker was killed
        if self.key.endswith("rank0") and self.status == "finished":
            address = self.client.who_has([self]).get(self.key, ("",))[0] or next(iter(pids))
            os.kill(pids[address], 9)
            deadline = time.monotonic() + 60
            while address in scheduler_workers(self.client) and time.monotonic() < deadline:
                time.sleep(0.1)
        return original(self, timeout=timeout)

    monkeypatch.setattr(Future, "result", fetch_after_the_worker_died)
    with pytest.raises(WorkerLost, match="rank 0"):
        run_live(fresh_client, _quick_or_count, [(100_000,), (100_000,)], TraceRecorder(), timeout_s=90)


class _FakeWorker:
    """Stands in for the dask worker under a rank: its event log and its (slow) line to the scheduler."""

    def __init__(self) -> None:
        import asyncio

        self.logged: list[tuple[str, dict]] = []
        self.loop_obj = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop_obj.run_forever, daemon=True)
        self.thread.start()
        self.reply = asyncio.Event()
        self.asked = 0
        self.loop = type("Loop", (), {"asyncio_loop": self.loop_obj})()
        self.scheduler = self

    async def event_is_set(self, name: str) -> bool:
        self.asked += 1
        await self.reply.wait()  # the scheduler answers only when the test says so
        return True

    def log_event(self, topic: str, msg: dict) -> None:
        self.logged.append((topic, msg))

    def close(self) -> None:
        self.loop_obj.call_soon_threadsafe(self.loop_obj.stop)
        self.thread.join(timeout=5)
        self.loop_obj.close()


def test_should_stop_never_waits_for_the_scheduler(monkeypatch):
    from dsgd_teach.runtime.ranks import live

    fake = _FakeWorker()
    monkeypatch.setattr(live, "get_worker", lambda: fake)
    ctx = live.WorkerContext("topic", "stop", 0, 1, time.time(), check_every_s=0.0)
    try:
        deadline = time.monotonic() + 10
        while fake.asked == 0:  # the question reaches the (fake) scheduler on the worker's event loop
            assert ctx.should_stop() is False and time.monotonic() < deadline
            time.sleep(0.01)
        for _ in range(50):  # the scheduler has not answered: every call returns at once, one question in flight
            assert ctx.should_stop() is False
        assert fake.asked == 1
        fake.loop_obj.call_soon_threadsafe(fake.reply.set)
        deadline = time.monotonic() + 10
        while not ctx.should_stop():  # the answer is picked up by a later call
            assert time.monotonic() < deadline, "the scheduler's answer was never read"
            time.sleep(0.01)
        assert ctx.should_stop() is True
    finally:
        fake.close()


def test_events_travel_packed_and_arrive_as_plain_values(monkeypatch):
    import numpy as np
    import torch

    from dsgd_teach.runtime.ranks import live

    fake = _FakeWorker()
    monkeypatch.setattr(live, "get_worker", lambda: fake)
    try:
        ctx = live.WorkerContext("topic", "stop", 3, 4, time.time(), flush_every_s=1e9)
        ctx.emit(step=np.int64(2), event="tick", loss=np.float32(0.5), grad_norm=torch.tensor(2.0), ranks=(1, 2))
        ctx.emit(step=3, event="tock", worker=1)
        ctx.flush(last=True)
        [(topic, msg)] = fake.logged
        assert topic == "topic" and isinstance(msg["packed"], bytes) and msg["last"] == 3
        stream = live.EventStream(client=None, topic="topic")
        stream._handler((0.0, msg))
        first, second = stream.drain()
        assert (first["worker"], first["step"], first["loss"], first["grad_norm"], first["ranks"]) == (3, 2, 0.5, 2.0, [1, 2])
        assert (second["worker"], second["event"]) == (1, "tock") and stream.finished == {3}
        ctx.emit(step=4, bad=object())
        with pytest.raises(TypeError, match="trace event value must be a number"):
            ctx.flush()
    finally:
        fake.close()


def test_a_batch_recorded_unwatched_equals_one_recorded_event_by_event():
    events = [{"worker": 0, "step": 1, "event": "tick", "time": 0.5, "extra": 2.0},
              {"worker": 1, "event": "update", "loss": 0.25}, {"step": 3, "time": 0.25}]
    seen: list[dict] = []
    fast, slow = TraceRecorder(t0=100.0), TraceRecorder(on_update=seen.append, t0=100.0)
    fast.extend([dict(e) for e in events])
    slow.extend([dict(e) for e in events])
    a, b = fast.frame(), slow.frame()
    assert len(seen) == 3 and list(a.columns) == list(b.columns)
    a_no_time, b_no_time = a.drop(columns="time"), b.drop(columns="time")  # events without a time get "now"
    assert a_no_time.equals(b_no_time) and list(a.time[:2]) == list(b.time[:2]) == [0.25, 0.5]


class _Failed:
    """A finished rank task that raised `exc` (what run_live reads of a dask future)."""

    def __init__(self, exc: BaseException | None) -> None:
        self.exc = exc
        self.status = "error" if exc is not None else "pending"

    def done(self) -> bool:
        return self.exc is not None

    def exception(self) -> BaseException | None:
        return self.exc


def test_a_rank_that_only_lost_its_peer_reports_the_peers_own_error() -> None:
    from dsgd_teach.runtime.ranks.rank_watch import first_cause

    closed = RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:36527")
    cause = TimeoutError("stage 1: receive of activation 3 from stage 0 did not complete within 6.0 s")
    futures = [_Failed(closed), _Failed(cause), _Failed(None)]
    assert first_cause(futures, 0, closed, wait_s=0.0) == (1, cause)
    assert first_cause(futures, 1, cause, wait_s=0.0) == (1, cause)  # an error of its own is the cause
    alone = [_Failed(closed), _Failed(None)]
    assert first_cause(alone, 0, closed, wait_s=0.1) == (0, closed)  # no peer's error came: its own is reported
