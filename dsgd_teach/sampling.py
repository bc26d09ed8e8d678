"""Deterministic minibatch sampling, shared by every chapter: the batch at step t depends only on (seed, rank, t).

Each epoch is a fresh permutation drawn from a private generator seeded by (seed + rank, epoch), so a retried task,
a one-worker parallel run and the sequential baseline all see exactly the same batches.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from .config import check_int


@lru_cache(maxsize=64)
def _permutation(n: int, seed: int, epoch: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch]).permutation(n)


def batch_indices(n: int, batch_size: int, step: int, seed: int) -> np.ndarray:
    """Row indices of the minibatch for `step` over n rows; a full batch when batch_size >= n.

    Batches tile consecutive epochs: with b = batch_size, step t takes positions [t*b, (t+1)*b) of the
    concatenation of per-epoch permutations (a batch may straddle two epochs).
    """
    check_int("n", n, 1)
    check_int("batch_size", batch_size, 1)
    check_int("step", step, 0)
    if batch_size >= n:
        return np.arange(n)
    pos, parts, remaining = step * batch_size, [], batch_size
    while remaining:
        epoch, offset = divmod(pos, n)
        take = min(remaining, n - offset)
        parts.append(_permutation(n, seed, epoch)[offset : offset + take])
        pos, remaining = pos + take, remaining - take
    return np.concatenate(parts)
