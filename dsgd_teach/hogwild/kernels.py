"""Compiled inner loops (numba, nogil): one logistic-regression SGD update per row, lock-free or locked.

Every kernel works in place on `w`, which may be a view of shared memory that other processes or threads are
writing at the same moment: that is Hogwild. The locked variants take the shared mutex around each update; the
round-robin variants wait for their turn before each update and pass it on after (turns.py).
Floating-point operations happen in a fixed order, so a single worker reproduces `reference.py` bit for bit.
The sparse loops prefetch the rows and coordinates of the next few updates (prefetch.py), which changes no
value but lets the wait for memory overlap with work.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from .mutex import acquire, mutex_unlock
from .prefetch import prefetch_read, prefetch_write
from .turns import finish_turns, pass_turn, wait_turn

#: How many updates ahead the sparse loops ask for: a row's offsets, then its entries and label, then the
#: coordinates of w it will write. Each stage needs what the one before fetched. On 2 cores (`make bench`'s sparse
#: problem, best of 8 repeats, two runs each way): one worker 4.0-4.3M -> 4.6-5.0M updates/s, two 6.4-6.6M ->
#: 8.5-9.1M. For w, distance 3 gave two workers the most updates/s of the distances 1 to 4 (bare processes).
OFFSETS_AHEAD, ROW_AHEAD, COORDS_AHEAD = 8, 4, 3


@njit(nogil=True, cache=True, inline="always")
def _logistic(margin: float, label: float) -> tuple[float, float]:
    """Loss log(1 + exp(-s m)) with s = 2y - 1, and its derivative in m, computed without overflow."""
    s = 2.0 * label - 1.0
    z = s * margin
    if z > 0.0:
        e = math.exp(-z)
        return math.log1p(e), -s * (e / (1.0 + e))
    e = math.exp(z)
    return -z + math.log1p(e), -s * (1.0 / (1.0 + e))


@njit(nogil=True, cache=True, inline="always")
def sparse_update(w, indptr, indices, data, y, i, lr):  # noqa: ANN001, ANN201 - numba types
    """Read w on row i's nonzeros, then write the gradient step back to exactly those coordinates."""
    margin = 0.0
    for k in range(indptr[i], indptr[i + 1]):
        margin += w[indices[k]] * data[k]
    loss, g = _logistic(margin, y[i])
    step = lr * g
    for k in range(indptr[i], indptr[i + 1]):
        w[indices[k]] -= step * data[k]
    return loss


@njit(nogil=True, cache=True, inline="always")
def _dense_update(w, X, y, i, lr):  # noqa: ANN001, ANN202 - numba types
    """The same update for a dense row: every coordinate is read and written."""
    margin = 0.0
    for j in range(X.shape[1]):
        margin += w[j] * X[i, j]
    loss, g = _logistic(margin, y[i])
    step = lr * g
    for j in range(X.shape[1]):
        w[j] -= step * X[i, j]
    return loss


@njit(nogil=True, cache=True, inline="always")
def _prefetch_ahead(w, indptr, indices, data, y, order, t):  # noqa: ANN001, ANN202 - numba types
    """Hint the memory that updates t + COORDS_AHEAD .. t + OFFSETS_AHEAD will touch (values unchanged)."""
    n = len(order)
    if t + OFFSETS_AHEAD < n:
        prefetch_read(indptr, order[t + OFFSETS_AHEAD])
    if t + ROW_AHEAD < n:
        i = order[t + ROW_AHEAD]
        prefetch_read(indices, indptr[i])
        prefetch_read(data, indptr[i])
        prefetch_read(y, i)
    if t + COORDS_AHEAD < n:
        i = order[t + COORDS_AHEAD]
        for k in range(indptr[i], indptr[i + 1]):
            prefetch_write(w, indices[k])


@njit(nogil=True, cache=True)
def sparse_sgd(w, indptr, indices, data, y, order, lr):  # noqa: ANN001, ANN201
    """Lock-free SGD over rows `order` of a CSR matrix; returns the summed loss seen before each update."""
    total = 0.0
    for t in range(len(order)):
        _prefetch_ahead(w, indptr, indices, data, y, order, t)
        total += sparse_update(w, indptr, indices, data, y, order[t], lr)
    return total


@njit(nogil=True, cache=True)
def sparse_sgd_locked(w, indptr, indices, data, y, order, lr, mutex):  # noqa: ANN001, ANN201
    """The same loop with the shared mutex held around every update (the locking baseline)."""
    total = 0.0
    for t in range(len(order)):
        _prefetch_ahead(w, indptr, indices, data, y, order, t)
        acquire(mutex)
        total += sparse_update(w, indptr, indices, data, y, order[t], lr)
        mutex_unlock(mutex)
    return total


@njit(nogil=True, cache=True)
def sparse_sgd_round_robin(w, indptr, indices, data, y, order, lr, turns, rank, last):  # noqa: ANN001, ANN201
    """The same loop taking turns: wait for this rank's turn, update, pass the turn on (the round-robin baseline).

    turns = (turn, done, abort) arrays of the shared block; last=True marks the rank done after its final update.
    Returns (summed loss, updates made): fewer than len(order) only when abort was set while waiting.
    """
    turn, done, abort = turns
    total = 0.0
    for t in range(len(order)):
        _prefetch_ahead(w, indptr, indices, data, y, order, t)
        if not wait_turn(turn, abort, rank):
            return total, t
        total += sparse_update(w, indptr, indices, data, y, order[t], lr)
        if last and t == len(order) - 1:
            finish_turns(done, rank)
        pass_turn(turn, done, rank)
    return total, len(order)


@njit(nogil=True, cache=True)
def dense_sgd(w, X, y, order, lr):  # noqa: ANN001, ANN201
    """Lock-free SGD over rows `order` of a dense matrix."""
    total = 0.0
    for i in order:
        total += _dense_update(w, X, y, i, lr)
    return total


@njit(nogil=True, cache=True)
def dense_sgd_locked(w, X, y, order, lr, mutex):  # noqa: ANN001, ANN201
    """Dense SGD with the mutex held around every update."""
    total = 0.0
    for i in order:
        acquire(mutex)
        total += _dense_update(w, X, y, i, lr)
        mutex_unlock(mutex)
    return total


@njit(nogil=True, cache=True)
def dense_sgd_round_robin(w, X, y, order, lr, turns, rank, last):  # noqa: ANN001, ANN201
    """Dense SGD taking turns (see sparse_sgd_round_robin)."""
    turn, done, abort = turns
    total = 0.0
    for t in range(len(order)):
        if not wait_turn(turn, abort, rank):
            return total, t
        total += _dense_update(w, X, y, order[t], lr)
        if last and t == len(order) - 1:
            finish_turns(done, rank)
        pass_turn(turn, done, rank)
    return total, len(order)


@njit(nogil=True, cache=True)
def count_hits(counts, indptr, indices, rows):  # noqa: ANN001, ANN201
    """The counting experiment: counts[j] += 1 for every nonzero j of every row, with no lock (may lose some)."""
    for i in rows:
        for k in range(indptr[i], indptr[i + 1]):
            counts[indices[k]] += 1


@njit(nogil=True, cache=True)
def count_hits_locked(counts, indptr, indices, rows, mutex):  # noqa: ANN001, ANN201
    """The counting experiment with the mutex held around each row's increments (loses none)."""
    for i in rows:
        acquire(mutex)
        for k in range(indptr[i], indptr[i + 1]):
            counts[indices[k]] += 1
        mutex_unlock(mutex)


def mean_loss(w: np.ndarray, X, y: np.ndarray) -> float:  # noqa: ANN001 - CSR matrix or ndarray
    """Mean logistic loss of w on (X, y), vectorised in numpy (for evaluation, not in the timed loop)."""
    margin = np.asarray(X @ w, dtype=np.float64).ravel()
    z = (2.0 * np.asarray(y, dtype=np.float64) - 1.0) * margin
    return float(np.mean(np.logaddexp(0.0, -z)))


def accuracy(w: np.ndarray, X, y: np.ndarray) -> float:  # noqa: ANN001 - CSR matrix or ndarray
    """Fraction of rows whose sign of X @ w matches the label."""
    margin = np.asarray(X @ w, dtype=np.float64).ravel()
    return float(np.mean((margin > 0) == (np.asarray(y) > 0)))
