"""One Hogwild worker: warm the kernels up, meet the others at the start, then update the shared vector lock-free.

`rank_loop` is the whole algorithm: pass after pass over its shard, chunk by chunk, each update written straight
into the shared vector (Niu et al. 2011, Algorithm 1). How ranks are started in dask workers (one per process, or
as threads of one process), how their events reach the driver and how a stop request reaches them is in tasks.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from . import kernels
from .config import CountingConfig, HogwildConfig
from .problem import HogwildData, epoch_order, kernel_arrays, load_data, shard_rows
from .shm import SharedBlock, barrier

AnyConfig = HogwildConfig | CountingConfig
Emit = Callable[..., None]
EMIT_EVERY_S = 0.1  # at most ~10 progress events per second per worker (each costs the scheduler CPU)
COUNT_CHUNK = 5_000


def private_turns() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Turn cells for one rank alone (always its turn): for warming up without touching the shared ones."""
    return np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64)


def run_chunk(
    config: AnyConfig, data: HogwildData, block: SharedBlock, rows: np.ndarray, epoch: int = 0, target=None,  # noqa: ANN001
    rank: int = 0, last: bool = False,
) -> tuple[float, int]:
    """Apply the updates of `rows` to the shared vector (or, warming up, to `target`); returns their summed loss
    and how many were made (fewer than len(rows) only if a round-robin run was aborted while this rank waited).

    `last` says these are the rank's final rows (the round-robin baseline then stops giving it turns)."""
    arrays = kernel_arrays(data)
    mutex = np.uint64(block.mutex_address)
    if isinstance(config, CountingConfig):
        counts = block["counts"] if target is None else target
        indptr, indices = arrays[0], arrays[1]
        if config.lock:
            kernels.count_hits_locked(counts, indptr, indices, rows, mutex)
        else:
            kernels.count_hits(counts, indptr, indices, rows)
        return float("nan"), len(rows)
    w = block["w"] if target is None else target
    lr = float(config.lr * config.lr_decay**epoch)
    if config.round_robin:
        turns = private_turns() if target is not None else (block["turn"], block["done"], block["abort"])
        rank = 0 if target is not None else rank
        kernel = kernels.sparse_sgd_round_robin if data.sparse else kernels.dense_sgd_round_robin
        return kernel(w, *arrays, rows, lr, turns, rank, last)
    if data.sparse:
        if config.lock:
            return kernels.sparse_sgd_locked(w, *arrays, rows, lr, mutex), len(rows)
        return kernels.sparse_sgd(w, *arrays, rows, lr), len(rows)
    if config.lock:
        return kernels.dense_sgd_locked(w, *arrays, rows, lr, mutex), len(rows)
    return kernels.dense_sgd(w, *arrays, rows, lr), len(rows)


def warm_up(config: AnyConfig, data: HogwildData, block: SharedBlock) -> None:
    """Compile (or load from numba's cache) the kernel on a scratch vector, so no timing includes compilation."""
    dtype = np.int64 if isinstance(config, CountingConfig) else np.float64
    scratch = np.zeros(data.n_features, dtype=dtype)
    run_chunk(config, data, block, np.arange(min(2, data.n_train), dtype=np.int64), target=scratch)


def _passes(config: AnyConfig) -> int:
    return config.passes if isinstance(config, CountingConfig) else config.epochs


def _pass_rows(config: AnyConfig, start: int, stop: int, epoch: int, rank: int) -> np.ndarray:
    if isinstance(config, CountingConfig):
        return np.arange(start, stop, dtype=np.int64)
    return epoch_order(start, stop, epoch, config.seed, rank)


def _update_passes(
    config: AnyConfig, data: HogwildData, block: SharedBlock, rank: int, shard: tuple[int, int], emit: Emit,
    should_stop: Callable[[], bool], stats: dict[str, Any], t0: float,
) -> None:
    """The timed part of rank_loop: pass after pass over the shard, chunk by chunk, reporting progress."""
    chunk = COUNT_CHUNK if isinstance(config, CountingConfig) else config.report_every
    progress, passes = block["progress"], _passes(config)
    stats["t_start"] = last_emit = time.time()
    loss_sum, loss_n = 0.0, 0
    for epoch in range(passes):
        order = _pass_rows(config, shard[0], shard[1], epoch, rank)
        for c0 in range(0, len(order), chunk):
            rows = order[c0 : c0 + chunk]
            last = epoch == passes - 1 and c0 + chunk >= len(order)
            k0 = time.perf_counter()
            loss, made = run_chunk(config, data, block, rows, epoch, rank=rank, last=last)
            stats["kernel_s"] += time.perf_counter() - k0
            if made:
                loss_sum, loss_n = loss_sum + loss, loss_n + made
            stats["updates"] += made
            stats["intended"] += data.row_nonzeros(rows) if isinstance(config, CountingConfig) else 0
            progress[rank] = stats["updates"]
            now = time.time()
            if loss_n and (now - last_emit >= EMIT_EVERY_S or last or made < len(rows)):
                emit(
                    time=now - t0, worker=rank, step=stats["updates"], event="update",
                    loss=loss_sum / loss_n, version_applied=int(progress.sum()), epoch=epoch,
                )
                last_emit, loss_sum, loss_n = now, 0.0, 0
            if made < len(rows) or should_stop():  # aborted while waiting for a turn, or asked to stop
                stats["stopped"] = True
                return


def rank_loop(
    config: AnyConfig, block: SharedBlock, rank: int, world: int, emit: Emit, should_stop: Callable[[], bool], t0: float
) -> dict[str, Any]:
    """One Hogwild worker: its shard, pass after pass, straight into the shared vector; returns its timings."""
    data = load_data(config.data_spec)
    start, stop = shard_rows(data.n_train, rank, world)
    warm_up(config, data, block)
    stats: dict[str, Any] = {"rank": rank, "updates": 0, "intended": 0, "kernel_s": 0.0, "stopped": False}
    if not barrier(block["ready"], rank, should_stop):
        block["abort"][0] = 1
        stats.update(stopped=True, t_start=time.time(), t_end=time.time())
        return stats
    try:
        _update_passes(config, data, block, rank, (start, stop), emit, should_stop, stats, t0)
    except BaseException:
        block["abort"][0] = 1  # peers waiting for this rank's turn must not wait for ever
        raise
    if stats["stopped"]:
        block["abort"][0] = 1
    stats["t_end"] = time.time()
    return stats
