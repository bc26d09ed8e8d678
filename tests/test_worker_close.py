"""A cluster the course starts closes without dask's heartbeat false alarm (runtime/worker_close.py)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

from distributed.core import Status

from dsgd_teach.runtime.worker_close import DropHeartbeatFailureWhileClosing


def _record(message: str) -> logging.LogRecord:
    return logging.LogRecord("distributed.worker", logging.ERROR, __file__, 1, message, None, None)


def test_only_the_heartbeat_failure_of_a_closing_worker_is_dropped() -> None:
    worker = SimpleNamespace(status=Status.running)
    keep = DropHeartbeatFailureWhileClosing(worker).filter
    failure = _record("Failed to communicate with scheduler during heartbeat.")
    assert keep(failure)  # a running worker that cannot reach its scheduler says so
    assert keep(_record("Compute Failed"))
    for status in (Status.closing, Status.closing_gracefully, Status.closed):
        worker.status = status
        assert not keep(failure)
        assert keep(_record("Compute Failed"))  # every other message of a closing worker still shows


def _filters() -> list[str]:
    """The filters on dask's worker logger in this worker."""
    return [type(f).__name__ for f in logging.getLogger("distributed.worker").filters]


def test_workers_of_a_course_cluster_and_those_a_resize_adds_have_the_filter(fresh_client) -> None:
    fresh_client.resize(3)
    installed = fresh_client.run(_filters)
    assert len(installed) == 3
    assert all(names == ["DropHeartbeatFailureWhileClosing"] for names in installed.values()), installed
