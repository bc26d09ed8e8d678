"""One Hogwild worker: warm the kernels up, meet the others at the start, then update the shared vector lock-free.

`hogwild_passes` is the whole algorithm: pass after pass over the worker's rows, each update written straight into
the shared vector (Niu et al. 2011, Algorithm 1); the update rule and its compiled loop are kernels.py's
`sparse_update` and `sparse_sgd`, and which loop a run uses (lock-free or a baseline) is kernel_choice.py's.
`Progress` holds what the loop reports. How ranks are started in dask workers (one per process, or as threads of
one process), how their events reach the driver and how a stop request reaches them is in tasks.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from .config import CountingConfig
from .kernel_choice import AnyConfig, UpdateRows, choose_kernel, warm_up
from .problem import HogwildData, epoch_order, load_data, shard_rows
from .shm import SharedBlock, barrier

__all__ = ["AnyConfig", "Progress", "hogwild_passes", "rank_loop", "warm_up"]
Emit = Callable[..., None]
EMIT_EVERY_S = 0.1  # at most ~10 progress events per second per worker (each costs the scheduler CPU)
COUNT_CHUNK = 5_000


def hogwild_passes(config: AnyConfig, data: HogwildData, update_rows: UpdateRows, rank: int, shard: tuple[int, int],
                   progress: Progress) -> None:
    """Niu et al. (2011), Algorithm 1, for one worker: pass after pass over its own rows in a fresh random order,
    each row's update written into the shared w at once, with no lock. The compiled loop takes a chunk of rows at a
    time; between chunks the worker reports its progress and checks for a stop."""
    counting = isinstance(config, CountingConfig)
    passes = config.passes if counting else config.epochs
    chunk = COUNT_CHUNK if counting else config.report_every
    for epoch in range(passes):
        lr = 0.0 if counting else float(config.lr * config.lr_decay**epoch)
        order = np.arange(*shard, dtype=np.int64) if counting else epoch_order(*shard, epoch, config.seed, rank)
        for c0 in range(0, len(order), chunk):
            rows = order[c0 : c0 + chunk]
            last = epoch == passes - 1 and c0 + chunk >= len(order)
            with progress.timed():
                loss, made = update_rows(rows, lr, last)
            if progress.chunk_done(epoch, loss, made, len(rows), last, data.row_nonzeros(rows) if counting else 0):
                return


class Progress:
    """A worker's counters, its "update" events (at most one per EMIT_EVERY_S) and the stop check."""

    def __init__(self, rank: int, shared_progress: np.ndarray, emit: Emit, should_stop: Callable[[], bool],
                 t0: float) -> None:
        self.rank, self.shared, self.emit, self.should_stop, self.t0 = rank, shared_progress, emit, should_stop, t0
        self.stats: dict[str, Any] = {"rank": rank, "updates": 0, "intended": 0, "kernel_s": 0.0, "stopped": False}
        self.loss_sum, self.loss_n, self.last_emit = 0.0, 0, time.time()

    def start(self) -> None:
        """The timed part begins."""
        self.stats["t_start"] = self.last_emit = time.time()

    @contextmanager
    def timed(self) -> Iterator[None]:
        """Adds the seconds spent inside the with-block to kernel_s."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.stats["kernel_s"] += time.perf_counter() - t0

    def chunk_done(self, epoch: int, loss: float, made: int, rows: int, last: bool, intended: int) -> bool:
        """Count a chunk's updates and report them now and then; True when the worker must stop (asked to, or its
        round-robin run was aborted while it waited for a turn)."""
        if made:
            self.loss_sum, self.loss_n = self.loss_sum + loss, self.loss_n + made
        self.stats["updates"] += made
        self.stats["intended"] += intended
        self.shared[self.rank] = self.stats["updates"]
        now = time.time()
        if self.loss_n and (now - self.last_emit >= EMIT_EVERY_S or last or made < rows):
            self.emit(time=now - self.t0, worker=self.rank, step=self.stats["updates"], event="update",
                      loss=self.loss_sum / self.loss_n, version_applied=int(self.shared.sum()), epoch=epoch)
            self.last_emit, self.loss_sum, self.loss_n = now, 0.0, 0
        if made < rows or self.should_stop():
            self.stats["stopped"] = True
        return self.stats["stopped"]


def rank_loop(
    config: AnyConfig, block: SharedBlock, rank: int, world: int, emit: Emit, should_stop: Callable[[], bool], t0: float
) -> dict[str, Any]:
    """One Hogwild worker: its shard, pass after pass, straight into the shared vector; returns its timings."""
    data = load_data(config.data_spec)
    shard = shard_rows(data.n_train, rank, world)
    warm_up(config, data, block)
    progress = Progress(rank, block["progress"], emit, should_stop, t0)
    if not barrier(block["ready"], rank, should_stop):
        block["abort"][0] = 1
        progress.stats.update(stopped=True, t_start=time.time(), t_end=time.time())
        return progress.stats
    progress.start()
    try:
        hogwild_passes(config, data, choose_kernel(config, data, block, rank), rank, shard, progress)
    except BaseException:
        block["abort"][0] = 1  # peers waiting for this rank's turn must not wait for ever
        raise
    if progress.stats["stopped"]:
        block["abort"][0] = 1
    progress.stats["t_end"] = time.time()
    return progress.stats
