"""A worker of a cluster the course starts finishes its heartbeat in flight before it closes its connections.

dask's Worker.close closes the worker's connections to the scheduler while a heartbeat may still be waiting for the
scheduler's answer; that heartbeat then fails, and dask logs "Failed to communicate with scheduler during heartbeat"
with a traceback into the notebook server's log (seen at a chapter's close on a loaded 2-core machine). Each worker of
a cluster the course starts loads this module as a dask worker preload (see worker_start.py). Its heartbeat callback
remembers the heartbeat in flight; at close, which runs the preload teardowns before it closes any connection, the
heartbeats stop and the one in flight is awaited first (HEARTBEAT_DRAIN_S at most, so a close never hangs on it).
"""

from __future__ import annotations

import asyncio
from typing import Any

#: Longest a closing worker waits for its heartbeat in flight (a nanny kills a worker still alive after ~4 s).
HEARTBEAT_DRAIN_S = 2.0


class TrackedHeartbeat:
    """The worker's heartbeat callback, remembering the heartbeat in flight so that close can wait for it."""

    def __init__(self, worker: Any) -> None:
        self.worker = worker
        self.in_flight: asyncio.Task | None = None

    def __call__(self) -> asyncio.Task:
        """Start one heartbeat (dask's own) as a task and remember it."""
        self.in_flight = asyncio.ensure_future(self.worker.heartbeat())
        return self.in_flight

    async def drain(self, timeout: float) -> None:
        """Wait up to timeout for the heartbeat in flight, unless this close was started by that heartbeat."""
        beat = self.in_flight
        if beat is None or beat.done() or beat is asyncio.current_task():
            return
        await asyncio.wait([beat], timeout=timeout)


def dask_setup(worker: Any) -> None:
    """dask's preload hook, run as each worker starts: its heartbeats go through a TrackedHeartbeat."""
    callback = worker.periodic_callbacks.get("heartbeat")
    if callback is not None:
        callback.callback = TrackedHeartbeat(worker)


async def dask_teardown(worker: Any) -> None:
    """dask's preload hook, run early in the worker's close: stop the heartbeats and let the last one finish."""
    callback = worker.periodic_callbacks.get("heartbeat")
    if callback is None:
        return
    callback.stop()
    if isinstance(callback.callback, TrackedHeartbeat):
        await callback.callback.drain(HEARTBEAT_DRAIN_S)
