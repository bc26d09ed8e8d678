"""runtime/actors/retries.py: a call is retried while its resource is unavailable, stops on a stop, gives up in time."""

from __future__ import annotations

import pytest

from dsgd_teach.runtime.actors import retries
from dsgd_teach.runtime.actors.retries import Stopped, repeat_until, retry


class Gone(RuntimeError):
    def __init__(self, key: int) -> None:
        super().__init__(f"resource {key} is gone")
        self.key = key


class Ctx:
    def __init__(self, stop_after: int = 10**9) -> None:
        self.asked, self.stop_after = 0, stop_after

    def should_stop(self) -> bool:
        self.asked += 1
        return self.asked > self.stop_after


@pytest.fixture(autouse=True)
def no_pause(monkeypatch) -> None:
    monkeypatch.setattr(retries, "RETRY_PAUSE_S", 0.0)


def flaky(failures: list[int]):
    """A call that fails with Gone(key) for each key in `failures`, in order, then answers 'ok'."""
    calls = []

    def call() -> str:
        calls.append(1)
        if len(calls) <= len(failures):
            raise Gone(failures[len(calls) - 1])
        return "ok"

    return call, calls


def test_a_call_is_retried_until_it_answers_and_each_resource_is_reported_once() -> None:
    call, calls = flaky([2, 2, 5, 2])
    reported, refreshed = [], []
    assert retry(Ctx(), call, Gone, wait_s=60, report=lambda e: reported.append(e.key),
                 refresh=lambda: refreshed.append(1)) == "ok"
    assert len(calls) == 5 and reported == [2, 5] and len(refreshed) == 4


def test_a_failing_refresh_costs_only_that_try() -> None:
    call, _ = flaky([1])

    def refresh() -> None:
        raise OSError("directory unreachable")

    assert retry(Ctx(), call, Gone, wait_s=60, refresh=refresh) == "ok"


def test_a_stop_request_ends_the_wait_with_stopped() -> None:
    call, calls = flaky([1] * 100)
    with pytest.raises(Stopped):
        retry(Ctx(stop_after=3), call, Gone, wait_s=60)
    assert len(calls) == 4


def test_past_its_time_the_unavailable_error_is_raised() -> None:
    call, calls = flaky([7] * 100)
    with pytest.raises(Gone, match="resource 7"):
        retry(Ctx(), call, Gone, wait_s=-1)
    assert len(calls) == 1


def test_other_errors_are_not_retried() -> None:
    def call() -> str:
        raise ValueError("a bug")

    with pytest.raises(ValueError):
        retry(Ctx(), call, Gone, wait_s=60)


def test_repeat_until_repeats_a_not_yet_answer_and_honours_stop_and_time() -> None:
    call, calls = flaky([0, 0, 0])
    assert repeat_until(Ctx(), call, Gone, wait_s=60) == "ok" and len(calls) == 4
    call, _ = flaky([0] * 100)
    with pytest.raises(Stopped):
        repeat_until(Ctx(stop_after=2), call, Gone, wait_s=60)
    call, calls = flaky([0] * 100)
    with pytest.raises(Gone):
        repeat_until(Ctx(), call, Gone, wait_s=-1)
    assert len(calls) == 1
