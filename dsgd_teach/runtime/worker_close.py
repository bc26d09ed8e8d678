"""Closing a cluster the course started without a false alarm in the notebook server's log.

A worker being closed shuts its connections to the scheduler; a heartbeat already in flight then fails, and dask
logs "Failed to communicate with scheduler during heartbeat." with a traceback (seen at the close of a chapter on a
loaded 2-core machine). Nothing is wrong: the worker was asked to stop. Workers of a cluster the course starts load
this module at start (dask's worker preload, see worker_start.py), which drops that one message while the worker
is closing; at any other time, and every other message, is logged as before.
"""

from __future__ import annotations

import logging
from typing import Any

from distributed.core import Status

#: The message dask logs when a heartbeat meets the worker's own closing connections.
HEARTBEAT_FAILED = "Failed to communicate with scheduler during heartbeat"
CLOSING = (Status.closing, Status.closed, Status.closing_gracefully)


class DropHeartbeatFailureWhileClosing(logging.Filter):
    """Drops the heartbeat-failure record while `worker` is closing; passes everything else."""

    def __init__(self, worker: Any) -> None:
        super().__init__()
        self.worker = worker

    def filter(self, record: logging.LogRecord) -> bool:
        """False (drop) only for the heartbeat failure of a closing worker."""
        return not (record.getMessage().startswith(HEARTBEAT_FAILED) and self.worker.status in CLOSING)


def dask_setup(worker: Any) -> None:
    """dask's preload hook, run in each worker as it starts: install the filter on dask's worker logger."""
    logging.getLogger("distributed.worker").addFilter(DropHeartbeatFailureWhileClosing(worker))


def dask_teardown(worker: Any) -> None:
    """dask's preload hook at the worker's end: remove the filter again."""
    logger = logging.getLogger("distributed.worker")
    for f in [f for f in logger.filters if isinstance(f, DropHeartbeatFailureWhileClosing) and f.worker is worker]:
        logger.removeFilter(f)
