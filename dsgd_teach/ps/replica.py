"""What every replica loop shares: its calls to the shards (surviving a shard restore), and their trace rows."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

import numpy as np

from ..runtime.actors.retries import repeat_until, retry
from ..runtime.ranks.live import WorkerContext
from ..trace import stat
from .server import START_TIMEOUT_S, ShardedServer, ShardUnavailable
from .shard import BarrierTimeout

T = TypeVar("T")

#: How long one barrier wait lasts before the replica re-checks the stop flag (a stop is honoured this fast).
BARRIER_SLICE_S = 0.25


def leave_thread_pool() -> None:
    """secede() from the worker's task slot: a replica runs for the whole run, and the slot must stay free so
    the driver can start a restored shard (an actor is created by a task) on this worker while it runs."""
    from distributed import secede

    from .monitor import quiet_released_shards_in_process

    secede()
    quiet_released_shards_in_process()


class ShardCalls:
    """A replica's calls to the sharded server, each waiting out a shard the driver is restoring elsewhere.

    Every call is retried (runtime/actors/retries.py) while a shard is unavailable, for at most 3 * timeout_s, and raises
    Stopped as soon as the run is asked to stop. Retrying a push is safe: pushes are idempotent by key.
    """

    def __init__(self, ctx: WorkerContext, server: ShardedServer, timeout_s: float) -> None:
        self.ctx, self.server, self.timeout_s, self.wait_s = ctx, server, timeout_s, 3 * timeout_s

    def _retry(self, call: Callable[[], T]) -> T:
        return retry(self.ctx, call, ShardUnavailable, self.wait_s, report=self._report, refresh=self.server.refresh)

    def _report(self, exc: Exception) -> None:
        """A trace row the first time a call finds a shard unavailable."""
        if isinstance(exc, ShardUnavailable):
            self.ctx.emit(event="shard_unavailable", shard=exc.shard, reason=exc.reason[:200])

    def pull(self) -> tuple[np.ndarray, list[int]]:
        """The parameters and each shard's version."""
        return self._retry(self.server.pull)

    def push(self, key: tuple[int, int], grad: np.ndarray, read: list[int]) -> list[dict[str, Any]]:
        """Push grad (computed from versions `read`); one receipt per shard."""
        return self._retry(partial(self.server.push, key, grad, read))

    def push_pull(self, key: tuple[int, int], grad: np.ndarray, read: list[int]
                  ) -> tuple[list[dict[str, Any]], np.ndarray, list[int]]:
        """push() and pull() in one round trip per shard: (receipts, parameters, versions)."""
        return self._retry(partial(self.server.push_pull, key, grad, read))

    def push_sync(self, key: tuple[int, int], grad: np.ndarray, read: list[int], n_expected: int
                  ) -> list[dict[str, Any]]:
        """Add grad to the current synchronous round (applied once n_expected replicas pushed)."""
        return self._retry(partial(self.server.push_sync, key, grad, read, n_expected))

    def barrier_pull(self, step: int) -> tuple[np.ndarray, list[int]]:
        """Version `step` of every shard, once every replica pushed into round step-1; BarrierTimeout if it does
        not come in 3 * timeout_s (the first barrier also waits for the slowest replica to start: a fresh worker
        imports torch). Each try waits one short slice on the shards, so a stop is honoured within that slice.
        """
        versions = [step] * self.server.n_shards
        wait_s = self.timeout_s + (START_TIMEOUT_S if step == 0 else 2 * self.timeout_s)
        return repeat_until(self.ctx, lambda: self._retry(partial(self.server.pull, versions, BARRIER_SLICE_S)),
                            BarrierTimeout, wait_s)


def emit_fetch(ctx: WorkerContext, server: ShardedServer, step: int, versions: list[int]) -> None:
    """One trace row per shard for a parameter fetch (bytes are those of the shard's slice)."""
    for info, v in zip(server.infos, versions, strict=True):
        ctx.emit(
            step=step, event="fetch", shard=info.index, shard_epoch=info.epoch, version_read=v,
            bytes_sent=(info.hi - info.lo) * 4,
        )


def emit_push(
    ctx: WorkerContext, server: ShardedServer, step: int, loss: float, receipts: list[dict[str, Any]], push_s: float
) -> None:
    """One trace row per shard for a gradient push: versions read and applied, staleness, bytes, applied or not."""
    for info, r in zip(server.infos, receipts, strict=True):
        ctx.emit(
            step=step, event="push", loss=loss, shard=r["shard"], shard_epoch=info.epoch,
            version_read=r["version_read"], version_applied=r["version_applied"], staleness=r["staleness"],
            bytes_sent=r["bytes"], applied=bool(r["applied"]), push_ms=push_s * 1e3,
        )


def mean_loss(losses: list[float]) -> float:
    """Mean of the minibatch losses since the last push (NaN when none)."""
    return stat(losses, how="mean")
