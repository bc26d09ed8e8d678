"""Elastic runs: when a worker dies, the ranks left form a smaller group and resume from their newest state.

A rank that loses a peer raises RankInterrupted carrying the state it can resume from (for local SGD, the last
average it completed). The driver then forms a group on the workers of those ranks and runs again from the newest
such state, recording a "regroup" event, until a group finishes, is stopped, or no rank is left (the idea of
torchrun's elastic training).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from distributed import Client

from ...trace import TraceRecorder
from .group import plan_group, run_in_group
from .live import RankInterrupted, WorkerLost


class Resumable(Protocol):
    """A state ranks can resume from; the one with the highest `step` is the newest."""

    step: int


S = TypeVar("S", bound=Resumable)


def run_elastic(client: Client, world: int, fn: Callable[..., Any], args: tuple[Any, ...], start: S,
                recorder: TraceRecorder, *, timeout_s: float, run_timeout_s: float, regroup: bool, what: str,
                describe: Callable[[S], dict[str, Any]] = lambda s: {"step": s.step}) -> tuple[list[Any], bool]:
    """Run fn(ctx, comm, *args, state) on `world` ranks from `start`; (results of the ranks that finished, stopped).

    regroup=False: a lost worker ends the run with run_live's error. regroup=True: the ranks a lost worker
    interrupted go on in a smaller group from the newest state they hold; when every rank is gone, WorkerLost
    names `what`.
    """
    workers: list[str] | None = None
    state: Any = start
    while True:
        spec = plan_group(client, world if workers is None else len(workers), "cpu", timeout_s, workers)
        results, stopped = run_in_group(client, spec, fn, [(*args, state)] * spec.world, recorder, run_timeout_s,
                                        on_worker_lost="drop" if regroup else "raise")
        done = [r for r in results if r is not None and not isinstance(r, RankInterrupted)]
        interrupted = [r for r in results if isinstance(r, RankInterrupted)]
        if done or not interrupted:
            break
        state = max((r.state for r in interrupted), key=lambda s: s.step)
        workers = [a for a, r in zip(spec.workers, results, strict=True) if isinstance(r, RankInterrupted)]
        recorder.record(worker=-1, event="regroup", world=len(workers), **describe(state))
    if not done and not stopped:
        raise WorkerLost(f"every worker of {what} died")
    return done, stopped
