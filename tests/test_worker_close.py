"""A cluster the course starts closes without a failed heartbeat in its workers' logs (runtime/clusters/worker_close.py)."""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path

from dsgd_teach import start_client

SCHEDULER_ANSWERS_AFTER_S = 1.0  # how long the scheduler sits on each heartbeat in the test below


def _log_worker_errors_to(path: str) -> None:
    """In a worker: append dask's worker log records to path (the notebook server's log, in a chapter)."""
    handler = logging.FileHandler(path)
    handler.setLevel(logging.ERROR)
    logging.getLogger("distributed.worker").addHandler(handler)


def test_a_heartbeat_in_flight_at_close_is_let_finish_not_logged_as_a_failure(tmp_path: Path) -> None:
    log = tmp_path / "workers.log"
    log.touch()
    client = start_client(2, quiet=True, use_gpu=False)
    try:
        client.run(_log_worker_errors_to, str(log))
        scheduler = client._owned_cluster.scheduler
        answer = scheduler.handlers["heartbeat_worker"]
        waiting: set[str] = set()
        every_worker_waits = threading.Event()

        async def slow_answer(**message):  # noqa: ANN003, ANN202 - dask's handler signature
            waiting.add(message["address"])
            if len(waiting) == 2:
                every_worker_waits.set()
            await asyncio.sleep(SCHEDULER_ANSWERS_AFTER_S)
            return answer(**message)

        scheduler.handlers["heartbeat_worker"] = slow_answer
        assert every_worker_waits.wait(30), "the workers sent no heartbeat within 30 s"
    finally:
        client.close()  # both workers have a heartbeat waiting for the scheduler's answer right now
    assert "Failed to communicate with scheduler during heartbeat" not in log.read_text(), log.read_text()


def _heartbeat_callback(dask_worker) -> str:  # noqa: ANN001 - dask passes its Worker
    return type(dask_worker.periodic_callbacks["heartbeat"].callback).__name__


def test_workers_a_resize_adds_track_their_heartbeats_too(fresh_client) -> None:
    fresh_client.resize(3)
    callbacks = fresh_client.run(_heartbeat_callback)
    assert sorted(callbacks.values()) == ["TrackedHeartbeat"] * 3, callbacks
