"""Long-running worker tasks: events stream back, Stop stops, a dead worker gives a clear error, not a hang."""

from __future__ import annotations

import os
import threading
import time

import pytest

from dsgd_teach.runtime.live import WorkerLost, run_live
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
