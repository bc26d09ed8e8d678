"""Which compiled loop a Hogwild run updates with: lock-free (the algorithm, kernels.sparse_sgd), or one of its
baselines (a mutex around every update, round-robin turns), on sparse or dense rows; or the counting experiment.

The worker's loop (worker.py) asks once for an `UpdateRows` and calls it on each chunk of its rows.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from . import kernels
from .config import CountingConfig, HogwildConfig
from .problem import HogwildData, kernel_arrays
from .shm import SharedBlock

AnyConfig = HogwildConfig | CountingConfig
#: update_rows(rows, lr, last) -> (summed loss, updates made); `last` marks the rank's final rows (round robin stops
#: giving it turns), and fewer updates than rows are made only when a round-robin run was aborted meanwhile.
UpdateRows = Callable[[np.ndarray, float, bool], tuple[float, int]]


def private_turns() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Turn cells for one rank alone (always its turn): for warming up without touching the shared ones."""
    return np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64)


def choose_kernel(config: AnyConfig, data: HogwildData, block: SharedBlock, rank: int,
                  target: np.ndarray | None = None) -> UpdateRows:
    """The update loop this run's config asks for, writing into the shared block (or, warming up, into `target`)."""
    arrays = kernel_arrays(data)
    mutex = np.uint64(block.mutex_address)
    if isinstance(config, CountingConfig):
        counts = block["counts"] if target is None else target
        indptr, indices = arrays[0], arrays[1]

        def count(rows: np.ndarray, lr: float, last: bool) -> tuple[float, int]:
            if config.lock:
                kernels.count_hits_locked(counts, indptr, indices, rows, mutex)
            else:
                kernels.count_hits(counts, indptr, indices, rows)
            return float("nan"), len(rows)

        return count
    w = block["w"] if target is None else target
    if config.round_robin:
        turns = private_turns() if target is not None else (block["turn"], block["done"], block["abort"])
        own = 0 if target is not None else rank
        taking_turns = kernels.sparse_sgd_round_robin if data.sparse else kernels.dense_sgd_round_robin
        return lambda rows, lr, last: taking_turns(w, *arrays, rows, lr, turns, own, last)
    if config.lock:
        locked = kernels.sparse_sgd_locked if data.sparse else kernels.dense_sgd_locked
        return lambda rows, lr, last: (locked(w, *arrays, rows, lr, mutex), len(rows))
    lock_free = kernels.sparse_sgd if data.sparse else kernels.dense_sgd
    return lambda rows, lr, last: (lock_free(w, *arrays, rows, lr), len(rows))


def warm_up(config: AnyConfig, data: HogwildData, block: SharedBlock) -> None:
    """Compile (or load from numba's cache) the kernel on a scratch vector, so no timing includes compilation."""
    dtype = np.int64 if isinstance(config, CountingConfig) else np.float64
    scratch = np.zeros(data.n_features, dtype=dtype)
    lr = 0.0 if isinstance(config, CountingConfig) else float(config.lr)
    choose_kernel(config, data, block, 0, target=scratch)(np.arange(min(2, data.n_train), dtype=np.int64), lr, False)
