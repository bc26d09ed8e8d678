"""One primitive for a rank's calls to an actor, so no rank loop polls, votes to stop or keeps deadlines itself.

An actor method that must wait (for a step to complete, for a staleness gate to open) waits one short slice at
most and answers "pending", so the calling rank regains control often. ActorCalls repeats such a call until the
answer is something else. Between tries it forwards the run's stop request to the actor (once: the actor then
wakes everyone with status "stopped") and, past the call's time limit, stops the actor and raises TimeoutError
naming the rank and the call. Methods named in `packed` travel as one pickled bytes object each way: dask
serialises every argument of an actor call separately, which costs more than a small gradient.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Iterable
from typing import Any, Protocol

from .retries import StopFlag

PENDING = "pending"


class StopSignal(StopFlag, Protocol):
    """What ActorCalls needs from a rank's context: its rank and whether the run was asked to stop."""

    rank: int


def pack(*fields: Any) -> bytes:
    """Many fields as one actor-call argument (or reply)."""
    return pickle.dumps(fields, protocol=5)


def unpack(message: bytes) -> tuple[Any, ...]:
    """The fields of a pack()ed message."""
    return pickle.loads(message)


def status_of(reply: Any) -> str | None:
    """The status an actor's reply carries: a bare string, the first field of a tuple, or a dict's 'status'."""
    if isinstance(reply, str):
        return reply
    if isinstance(reply, tuple) and reply and isinstance(reply[0], str):
        return reply[0]
    if isinstance(reply, dict):
        return reply.get("status")
    return None


class ActorCalls:
    """A rank's calls to one actor: `calls("pull", rank)` returns the first reply that is not "pending"."""

    def __init__(self, actor: Any, ctx: StopSignal, timeout_s: float, call_s: float = 30.0,
                 packed: Iterable[str] = (), what: str = "the server") -> None:
        self.actor, self.ctx, self.timeout_s, self.call_s = actor, ctx, float(timeout_s), float(call_s)
        self.packed, self.what = frozenset(packed), what
        self.last_s = 0.0  # seconds the last call took, its "pending" replies included
        self.stop_sent = False

    def __call__(self, method: str, *args: Any, extra_s: float = 0.0, timeout_s: float | None = None) -> Any:
        """Call `method` until it answers other than "pending"; `extra_s` lengthens a call that waits on purpose."""
        limit = self.timeout_s if timeout_s is None else timeout_s
        started = time.monotonic()
        while True:
            self.stopping()
            reply = self._once(method, args, extra_s)
            self.last_s = time.monotonic() - started
            if status_of(reply) != PENDING:
                return reply
            if self.last_s > limit:
                self.stop_everyone()
                raise TimeoutError(
                    f"rank {self.ctx.rank}: {method} to {self.what} was still pending after {limit:.0f} s "
                    "(a worker may have died, or a straggler delay is longer than timeout_s)"
                )

    def stopping(self) -> bool:
        """True once the run was asked to stop; the first time, the actor is told to wake everyone with 'stopped'."""
        if not self.stop_sent and self.ctx.should_stop():
            self.stop_everyone()
        return self.stop_sent

    def stop_everyone(self) -> None:
        """Ask the actor to answer every waiting and future call with 'stopped'."""
        self.stop_sent = True
        self._once("stop_all", (), 0.0)

    def _once(self, method: str, args: tuple[Any, ...], extra_s: float) -> Any:
        """One call, bounded by call_s + extra_s; plain (non-actor) objects' return values are taken as they are."""
        if method in self.packed:
            reply = getattr(self.actor, f"{method}_packed")(pack(*args))
        else:
            reply = getattr(self.actor, method)(*args)
        if hasattr(reply, "result"):
            reply = reply.result(timeout=self.call_s + extra_s)
        return unpack(reply) if method in self.packed else reply
