"""Offline data sets, deterministic from a seed, and their split into per-worker shards without duplication."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import scipy.sparse as sp

from .config import check_choice, check_float, check_int

DATASETS = ("digits", "dense", "sparse")


@dataclass(frozen=True)
class Dataset:
    """Features X (dense ndarray or CSR matrix), labels y, and the number of classes."""

    name: str
    X: np.ndarray | sp.csr_matrix
    y: np.ndarray
    n_classes: int

    @property
    def n_samples(self) -> int:
        return self.X.shape[0]

    @property
    def n_features(self) -> int:
        return self.X.shape[1]

    def subset(self, index: np.ndarray | slice) -> Dataset:
        """Rows `index` of this data set (a view when index is a slice)."""
        return Dataset(self.name, self.X[index], self.y[index], self.n_classes)


def digits(n_samples: int | None = None, seed: int = 0) -> Dataset:
    """scikit-learn's bundled 8x8 digits (1797 images, 10 classes), scaled to [0, 1] and shuffled by seed."""
    from sklearn.datasets import load_digits

    raw = load_digits()
    order = np.random.default_rng(seed).permutation(len(raw.target))
    if n_samples is not None:
        check_int("n_samples", n_samples, 10, len(order))
        order = order[:n_samples]
    X = (raw.data[order] / 16.0).astype(np.float32)
    return Dataset("digits", X, raw.target[order].astype(np.int64), 10)


def dense_logistic(n_samples: int = 4000, n_features: int = 50, seed: int = 0, noise: float = 0.1) -> Dataset:
    """A dense binary logistic-regression problem: labels from a hidden weight vector, with label noise."""
    check_int("n_samples", n_samples, 2)
    check_int("n_features", n_features, 1)
    check_float("noise", noise, 0.0, 0.5)
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n_samples, n_features)).astype(np.float32)
    w = rng.standard_normal(n_features).astype(np.float32) / np.sqrt(n_features)
    y = (X @ w > 0).astype(np.int64)
    flip = rng.random(n_samples) < noise
    y[flip] = 1 - y[flip]
    return Dataset("dense", X, y, 2)


def sparse_powerlaw(
    n_samples: int = 20000,
    n_features: int = 20000,
    density: float = 0.001,
    seed: int = 0,
    exponent: float = 1.1,
    noise: float = 0.05,
) -> Dataset:
    """An RCV1-like sparse binary problem: each row has ~density*n_features nonzeros, drawn from a power law.

    Feature j is picked with probability proportional to (j+1)^-exponent, so a few features are common and most
    are rare, as with words in documents. `density` is the adjustable sparsity: the fraction of nonzero
    entries per row (1.0 means dense). Feature ids are then shuffled, as in a real vocabulary (alphabetical or
    hashed ids), so the frequent features do not share cache lines the way ids sorted by frequency would.
    """
    check_int("n_samples", n_samples, 2)
    check_int("n_features", n_features, 1)
    check_float("density", density, 0.0, 1.0, lo_open=True)
    check_float("exponent", exponent, 0.0, 5.0)
    rng = np.random.default_rng(seed)
    nnz_per_row = max(1, int(round(density * n_features)))
    probs = (np.arange(1, n_features + 1, dtype=np.float64)) ** -exponent
    probs /= probs.sum()
    if nnz_per_row >= n_features:
        cols = np.tile(np.arange(n_features), n_samples)
        nnz_per_row = n_features
    else:
        # Draw with replacement then de-duplicate per row; rows keep at least one feature.
        cols = rng.choice(n_features, size=(n_samples, nnz_per_row), p=probs)
        cols.sort(axis=1)
        cols = cols.ravel()
    rows = np.repeat(np.arange(n_samples), nnz_per_row)
    vals = rng.random(rows.size).astype(np.float32) + 0.5
    X = sp.csr_matrix((vals, (rows, cols)), shape=(n_samples, n_features), dtype=np.float32)
    X.sum_duplicates()
    # Normalise rows to unit length so one step size suits every density.
    norms = np.sqrt(np.asarray(X.multiply(X).sum(axis=1)).ravel())
    X = sp.diags(1.0 / np.maximum(norms, 1e-12)).astype(np.float32) @ X
    X = sp.csr_matrix(X, dtype=np.float32)
    w = rng.standard_normal(n_features).astype(np.float32)
    y = (X @ w > 0).astype(np.int64)
    flip = rng.random(n_samples) < noise
    y[flip] = 1 - y[flip]
    X = sp.csr_matrix(X[:, rng.permutation(n_features)], dtype=np.float32)
    X.sort_indices()
    return Dataset("sparse", X, y, 2)


@lru_cache(maxsize=8)
def load(name: str, seed: int = 0, n_samples: int | None = None, density: float = 0.001) -> Dataset:
    """Build (and cache per process) a data set by name; workers call this so no data crosses the network."""
    check_choice("dataset", name, DATASETS)
    if name == "digits":
        return digits(n_samples, seed)
    if name == "dense":
        return dense_logistic(n_samples or 4000, seed=seed)
    return sparse_powerlaw(n_samples or 20000, density=density, seed=seed)


def shard_bounds(n_samples: int, rank: int, world: int) -> tuple[int, int]:
    """[start, stop) of rank's contiguous shard; shards differ in size by at most one row."""
    check_int("world", world, 1)
    check_int("rank", rank, 0, world - 1)
    base, extra = divmod(n_samples, world)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def shard(data: Dataset, rank: int, world: int) -> Dataset:
    """The rank-th of `world` disjoint shards of data (together they cover every row exactly once)."""
    start, stop = shard_bounds(data.n_samples, rank, world)
    return data.subset(slice(start, stop))


def train_test_split(data: Dataset, test_fraction: float = 0.2) -> tuple[Dataset, Dataset]:
    """Split off the last test_fraction of rows (data sets are already shuffled by their seed)."""
    check_float("test_fraction", test_fraction, 0.0, 1.0, hi_open=True)
    cut = int(round(data.n_samples * (1 - test_fraction)))
    return data.subset(slice(0, cut)), data.subset(slice(cut, data.n_samples))
