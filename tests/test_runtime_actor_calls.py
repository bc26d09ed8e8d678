"""ActorCalls, the one primitive rank loops use to call an actor: repeats 'pending', forwards stops, times out."""

from __future__ import annotations

import time
from concurrent.futures import Future
from typing import Any

import pytest

from dsgd_teach.runtime.actors import ActorCalls, NoReply, call_each, pack, unpack


class Ctx:
    """A rank's stop flag, raised after `stop_after` checks (never, if None)."""

    def __init__(self, stop_after: int | None = None) -> None:
        self.rank, self.checks, self.stop_after = 3, 0, stop_after

    def should_stop(self) -> bool:
        self.checks += 1
        return self.stop_after is not None and self.checks > self.stop_after


class Gate:
    """An actor stand-in: pull() answers 'pending' `pending` times, then 'run'; 'stopped' once stop_all ran."""

    def __init__(self, pending: int) -> None:
        self.pending, self.calls, self.stops = pending, 0, 0

    def _answer(self, reply: Any) -> Future:
        future: Future = Future()
        future.set_result(reply)
        return future

    def pull(self, rank: int) -> Future:
        self.calls += 1
        if self.stops:
            return self._answer(("stopped", 0, None))
        if self.calls <= self.pending:
            return self._answer(("pending", 0, None))
        return self._answer(("run", 7, [rank]))

    def push_packed(self, message: bytes) -> Future:
        rank, grad = unpack(message)
        return self._answer(pack("aggregated", rank, sum(grad)))

    def stop_all(self) -> Future:
        self.stops += 1
        return self._answer(None)


def test_a_pending_call_is_repeated_until_it_answers() -> None:
    gate = Gate(pending=4)
    calls = ActorCalls(gate, Ctx(), timeout_s=10)
    assert calls("pull", 3) == ("run", 7, [3])
    assert gate.calls == 5 and gate.stops == 0


def test_a_stop_request_is_forwarded_once_and_the_reply_says_stopped() -> None:
    gate = Gate(pending=10**9)
    calls = ActorCalls(gate, Ctx(stop_after=2), timeout_s=10)
    assert calls("pull", 3)[0] == "stopped"
    assert calls.stopping() and gate.stops == 1
    calls("pull", 3)
    assert gate.stops == 1  # told once, not at every call


def test_a_call_still_pending_past_its_limit_stops_the_actor_and_names_rank_and_method() -> None:
    gate = Gate(pending=10**9)
    calls = ActorCalls(gate, Ctx(), timeout_s=0.05, what="the step coordinator")
    with pytest.raises(TimeoutError, match=r"rank 3: pull to the step coordinator was still pending after 0 s"):
        calls("pull", 3)
    assert gate.stops == 1


def test_packed_methods_travel_as_one_bytes_object_each_way() -> None:
    calls = ActorCalls(Gate(pending=0), Ctx(), timeout_s=10, packed=("push",))
    assert calls("push", 2, [1.0, 2.5]) == ("aggregated", 2, 3.5)


def test_a_plain_object_s_return_value_is_taken_as_it_is() -> None:
    class Plain:
        def join(self, rank: int) -> str:
            return "run"

    assert ActorCalls(Plain(), Ctx(), timeout_s=1)("join", 0) == "run"


class _Shard:
    """An actor stand-in whose method returns a future answered at once, never, or with an error."""

    def __init__(self, answer: Any = None, error: BaseException | None = None, raise_on_call: bool = False,
                 never: bool = False) -> None:
        self.answer, self.error, self.raise_on_call, self.never = answer, error, raise_on_call, never

    def get(self, x: int) -> Future:
        if self.raise_on_call:
            raise RuntimeError("worker gone")
        f: Future = Future()
        if self.error is not None:
            f.set_exception(self.error)
        elif not self.never:
            f.set_result((self.answer, x))
        return f


def test_call_each_returns_every_reply_in_order() -> None:
    assert call_each([_Shard("a"), _Shard("b")], "get", [(1,), (2,)], 5.0, 0.05) == [("a", 1), ("b", 2)]


def test_call_each_names_the_actor_that_failed_timed_out_or_moved() -> None:
    with pytest.raises(NoReply, match="actor 1: RuntimeError: worker gone") as info:
        call_each([_Shard(), _Shard(raise_on_call=True)], "get", [(1,), (2,)], 5.0, 0.05)
    assert info.value.index == 1
    with pytest.raises(NoReply, match="actor 0: KeyError") as info:
        call_each([_Shard(error=KeyError("x")), _Shard()], "get", [(1,), (2,)], 5.0, 0.05)
    with pytest.raises(NoReply, match="actor 1: no answer within 0.3 s"):
        call_each([_Shard(), _Shard(never=True)], "get", [(1,), (2,)], 0.3, 0.05)


def test_call_each_gives_up_at_once_when_the_actor_moved_and_passes_the_callers_errors_through() -> None:
    asked: list[int] = []

    def moved(i: int) -> bool:
        asked.append(i)
        return True

    started = time.monotonic()
    with pytest.raises(NoReply, match="actor 0: no answer within 60 s"):
        call_each([_Shard(never=True)], "get", [(1,)], 60.0, 0.05, moved=moved)
    assert asked == [0] and time.monotonic() - started < 30  # one slice, not the whole minute
    with pytest.raises(ValueError, match="bad key"):
        call_each([_Shard(error=ValueError("bad key"))], "get", [(1,)], 5.0, 0.05, passthrough=(ValueError,))
