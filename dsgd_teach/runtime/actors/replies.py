"""One call to each of several actors at once (a sharded server's shards), every reply awaited under one deadline.

A reply is waited for in short slices, so a caller whose actor has meanwhile moved (restored on another worker)
gives up at once instead of after the whole deadline. A call that raises, a reply that does not come, and an
actor that moved all raise NoReply naming which actor; errors the caller must see as they are pass through.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any


class NoReply(RuntimeError):
    """Actor `index` did not answer: its call failed, timed out, or the actor moved while the caller waited."""

    def __init__(self, index: int, reason: str) -> None:
        super().__init__(f"actor {index}: {reason}")
        self.index, self.reason = index, reason


def call_each(actors: Sequence[Any], method: str, per_actor_args: Sequence[tuple], timeout_s: float, slice_s: float,
              moved: Callable[[int], bool] = lambda i: False,
              passthrough: tuple[type[BaseException], ...] = ()) -> list[Any]:
    """actors[i].method(*per_actor_args[i]) for every i, started together; their replies in order."""
    futures = []
    for i, (actor, args) in enumerate(zip(actors, per_actor_args, strict=True)):
        try:
            futures.append(getattr(actor, method)(*args))
        except Exception as exc:  # dask raises here when it already knows the actor's worker is gone
            raise NoReply(i, f"{type(exc).__name__}: {exc}") from exc
    deadline = time.monotonic() + timeout_s
    return [_reply(i, future, deadline, timeout_s, slice_s, moved, passthrough) for i, future in enumerate(futures)]


def _reply(i: int, future: Any, deadline: float, timeout_s: float, slice_s: float, moved: Callable[[int], bool],
           passthrough: tuple[type[BaseException], ...]) -> Any:
    """One actor's reply, waited for in slices until the deadline or until the actor is seen to have moved."""
    while True:
        left = deadline - time.monotonic()
        try:
            return future.result(timeout=max(0.01, min(left, slice_s)))
        except passthrough:
            raise
        except (TimeoutError, asyncio.TimeoutError) as exc:
            if left > slice_s and not moved(i):
                continue
            raise NoReply(i, f"no answer within {timeout_s:g} s") from exc
        except (Exception, asyncio.CancelledError) as exc:
            raise NoReply(i, f"{type(exc).__name__}: {exc}") from exc
