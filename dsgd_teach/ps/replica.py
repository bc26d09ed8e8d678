"""Pieces every replica loop shares: calls that survive a shard restore, and trace rows for fetches and pushes."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from ..runtime.live import WorkerContext
from .server import ShardedServer, ShardUnavailable

T = TypeVar("T")


class Stopped(Exception):
    """The run's stop flag was raised while a replica waited for a shard."""


def leave_thread_pool() -> None:
    """secede() from the worker's task slot: a replica runs for the whole run, and the slot must stay free so
    the driver can start a restored shard (an actor is created by a task) on this worker while it runs."""
    from distributed import secede

    from .monitor import quiet_released_shards_in_process

    secede()
    quiet_released_shards_in_process()


def retrying(ctx: WorkerContext, server: ShardedServer, call: Callable[[], T], wait_s: float) -> T:
    """call(), retried while a shard is unavailable: the driver may be restoring it on another worker.

    Retrying a push is safe because pushes are idempotent by key. Gives up (re-raising ShardUnavailable) after
    wait_s seconds, and raises Stopped as soon as the run is asked to stop (e.g. the driver gave up on the shard).
    """
    deadline = time.monotonic() + wait_s
    reported: set[int] = set()
    while True:
        try:
            return call()
        except ShardUnavailable as exc:
            if exc.shard not in reported:
                reported.add(exc.shard)
                ctx.emit(event="shard_unavailable", shard=exc.shard, reason=exc.reason[:200])
            if ctx.should_stop():
                raise Stopped from exc
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
            try:
                server.refresh()
            except Exception:  # noqa: BLE001 - the directory read is retried with the call
                pass


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
    return float(np.mean(losses)) if losses else float("nan")
