"""The driver's side of a parameter-server run: record events, evaluate the server's model, restore lost shards.

run_live() hands the recorder the workers' events every poll (about 20 times a second), in the thread that
called run(). ServerWatch uses those calls as its clock: it also checks, a few times a second, whether a shard's
worker has left (then restores the shard from its checkpoint, or raises ShardUnavailable naming it) and
whether the server has passed the next evaluation point.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from ..problem import Problem
from ..trace import OnUpdate, TraceRecorder
from .server import ShardedServer, ShardUnavailable


class ServerWatch(TraceRecorder):
    """A TraceRecorder that also evaluates the server's parameters and handles shards whose worker died."""

    def __init__(
        self, on_update: OnUpdate | None, server: ShardedServer, problem: Problem, eval_every: int,
        check_every_s: float = 0.25,
    ) -> None:
        super().__init__(on_update)
        self.server, self.problem, self.eval_every = server, problem, eval_every
        self.check_every_s = check_every_s
        self.next_eval = eval_every
        self.last_eval = -1  # updates at the last evaluation
        self.last_seen: dict[tuple[int, int], int] = {}  # (shard, epoch) -> highest version a receipt showed
        self.restores: list[dict[str, Any]] = []
        self._last_check = 0.0

    def extend(self, events: list[dict[str, Any]]) -> None:
        """Record the workers' events, then (rate-limited) check the shards and evaluate."""
        for e in events:
            if e.get("event") == "push" and "shard" in e:
                key = (int(e["shard"]), int(e.get("shard_epoch", 0)))
                self.last_seen[key] = max(self.last_seen.get(key, 0), int(e.get("version_applied", 0)))
        super().extend(events)
        now = time.monotonic()
        if now - self._last_check >= self.check_every_s:
            self._last_check = now
            for shard in self.server.lost_shards():
                self._restore(shard)
            self.evaluate()

    def _restore(self, shard: int) -> None:
        old = self.server.infos[shard]
        info = self.server.restore(shard)  # raises ShardUnavailable (naming the shard) when it cannot
        seen = self.last_seen.get((shard, old.epoch), info["checkpoint_version"])
        info["lost_updates"] = max(0, seen - info["checkpoint_version"])
        self.restores.append(info)
        self.record(
            event="shard_restored", shard=shard, version_applied=info["checkpoint_version"],
            lost_updates=info["lost_updates"], shard_epoch=info["epoch"], address=info["new_address"],
        )

    def evaluate(self, force: bool = False) -> np.ndarray | None:
        """Pull and evaluate when the server passed the next evaluation point (or when forced); returns params."""
        try:
            if not force and min(self.server.ping(timeout=1.0)) < self.next_eval:
                return None
            params, versions = self.server.pull(timeout=None if force else 2.0)
        except ShardUnavailable:
            if force:
                raise
            return None  # a shard is on its way out: the next check restores it or stops the run
        updates = min(versions)
        metrics = self.problem.evaluate(params)
        self.record(
            event="eval", loss=metrics["train_loss"], version_applied=updates, step=updates, updates=updates,
            **metrics,
        )
        self.next_eval = (updates // self.eval_every + 1) * self.eval_every
        self.last_eval = updates
        return params

    def lost_updates(self, trace: Any) -> int:
        """Updates that reached a shard after its last checkpoint and died with it, from the whole trace."""
        total = 0
        for info in self.restores:
            pushes = trace[(trace.event == "push") & (trace.get("shard") == info["shard"])]
            if "shard_epoch" in pushes:
                pushes = pushes[pushes.shard_epoch == info["epoch"] - 1]
            seen = int(pushes.version_applied.max()) if len(pushes) else info["checkpoint_version"]
            info["lost_updates"] = max(0, seen - info["checkpoint_version"])
            total += info["lost_updates"]
        return total


class _CancelledActorCall(logging.Filter):
    """Drops tornado's report of an actor call still waiting on a shard that was released (it died)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not (type(exc).__name__ == "FutureCancelledError" and "ps-" in str(exc))


def quiet_released_shards_in_process() -> None:
    """Install that filter for good in this (worker) process: a replica's call to a dead shard ends that way."""
    log = logging.getLogger("tornado.application")
    if not any(isinstance(f, _CancelledActorCall) for f in log.filters):
        log.addFilter(_CancelledActorCall())


@contextmanager
def quiet_released_shards() -> Iterator[None]:
    """While a run restores or releases shards, keep dask's leftover-call tracebacks out of the notebook."""
    log, flt = logging.getLogger("tornado.application"), _CancelledActorCall()
    log.addFilter(flt)
    try:
        yield
    finally:
        log.removeFilter(flt)
