"""Calls that wait out a resource being restored elsewhere: retried until they answer, the run stops, or time is up.

A rank's call to a service (a parameter shard, say) can fail because the service is being moved or restored on
another worker. `retry` repeats such a call, reporting each unavailable resource once, refreshing the caller's
view of where things live between tries, and raising Stopped as soon as the run is asked to stop.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol, TypeVar

T = TypeVar("T")

#: Pause between two tries of a call whose resource is unavailable.
RETRY_PAUSE_S = 0.1


class Stopped(Exception):
    """The run's stop flag was raised while a rank waited for a resource."""


class StopFlag(Protocol):
    """What a waiting call needs from the rank's context: whether the run was asked to stop."""

    def should_stop(self) -> bool: ...


def retry(ctx: StopFlag, call: Callable[[], T], unavailable: type[Exception], wait_s: float, *,
          report: Callable[[Exception], None] = lambda exc: None,
          refresh: Callable[[], None] = lambda: None) -> T:
    """call(), repeated while it raises `unavailable`; re-raises that after wait_s seconds, Stopped on a stop.

    `report` sees the first failure (and, if `unavailable` has a `key`, the first of each key); `refresh` runs
    between tries, and its own errors only cost that try. Only calls that are safe to repeat may be retried.
    """
    deadline = time.monotonic() + wait_s
    reported: set[object] = set()
    while True:
        try:
            return call()
        except unavailable as exc:
            key = getattr(exc, "key", None)
            if key not in reported:
                reported.add(key)
                report(exc)
            if ctx.should_stop():
                raise Stopped from exc
            if time.monotonic() > deadline:
                raise
            time.sleep(RETRY_PAUSE_S)
            try:
                refresh()
            except Exception:  # noqa: BLE001 - the refresh is retried with the call
                pass


def repeat_until(ctx: StopFlag, call: Callable[[], T], not_yet: type[Exception], wait_s: float) -> T:
    """call(), repeated while it raises `not_yet` (each try waits one short slice itself); Stopped on a stop, and
    `not_yet` re-raised after wait_s seconds."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return call()
        except not_yet:
            if ctx.should_stop():
                raise Stopped from None
            if time.monotonic() > deadline:
                raise
