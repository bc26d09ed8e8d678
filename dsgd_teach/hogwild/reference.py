"""Plain-Python sequential oracles: what one worker must reproduce exactly, written independently of numba."""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from .problem import HogwildData, epoch_order, shard_rows


def logistic_step(w: list[float], cols: list[int], vals: list[float], label: float, lr: float) -> float:
    """One SGD step on one row (in place on the list w); returns the loss before the step."""
    margin = 0.0
    for j, v in zip(cols, vals, strict=True):
        margin += w[j] * v
    s = 2.0 * label - 1.0
    z = s * margin
    if z > 0.0:
        e = math.exp(-z)
        loss, g = math.log1p(e), -s * (e / (1.0 + e))
    else:
        e = math.exp(z)
        loss, g = -z + math.log1p(e), -s * (1.0 / (1.0 + e))
    step = lr * g
    for j, v in zip(cols, vals, strict=True):
        w[j] -= step * v
    return loss


def row_entries(data: HogwildData, i: int) -> tuple[list[int], list[float]]:
    """Column indices and values of training row i, as Python numbers."""
    if data.sparse:
        lo, hi = data.X.indptr[i], data.X.indptr[i + 1]
        return [int(j) for j in data.X.indices[lo:hi]], [float(v) for v in data.X.data[lo:hi]]
    return list(range(data.n_features)), [float(v) for v in data.X[i]]


def sequential_sgd(
    data: HogwildData, lr: float, epochs: int, seed: int, w0: Iterable[float] | None = None, lr_decay: float = 1.0
) -> np.ndarray:
    """Sequential SGD over all training rows, epoch by epoch in epoch_order(..., rank=0), step lr * lr_decay**k."""
    w = [0.0] * data.n_features if w0 is None else [float(v) for v in w0]
    start, stop = shard_rows(data.n_train, 0, 1)
    for epoch in range(epochs):
        for i in epoch_order(start, stop, epoch, seed, 0):
            cols, vals = row_entries(data, int(i))
            logistic_step(w, cols, vals, float(data.y[i]), lr * lr_decay**epoch)
    return np.array(w, dtype=np.float64)


def round_robin_sgd(
    data: HogwildData, lr: float, epochs: int, seed: int, world: int, lr_decay: float = 1.0
) -> np.ndarray:
    """What `world` workers taking turns must produce: one sequential SGD over their updates interleaved in rank
    order (rank 0's first, rank 1's first, ..., rank 0's second, ...), a rank with none left being skipped."""
    queues = []
    for rank in range(world):
        start, stop = shard_rows(data.n_train, rank, world)
        queues.append([(int(i), lr * lr_decay**epoch) for epoch in range(epochs)
                       for i in epoch_order(start, stop, epoch, seed, rank)])
    w = [0.0] * data.n_features
    for k in range(max(len(q) for q in queues)):
        for queue in queues:
            if k < len(queue):
                i, step = queue[k]
                cols, vals = row_entries(data, i)
                logistic_step(w, cols, vals, float(data.y[i]), step)
    return np.array(w, dtype=np.float64)


def sequential_counts(data: HogwildData, passes: int) -> np.ndarray:
    """What the counting experiment must land: each feature's number of nonzeros times the passes."""
    counts = np.zeros(data.n_features, dtype=np.int64)
    if data.sparse:
        np.add.at(counts, data.X.indices, 1)
    else:
        counts += data.n_train
    return counts * passes
