"""The chapter's two problems as kernel-ready arrays, built from a seed in whichever process needs them.

Sparse: the power-law RCV1-like data (`dsgd_teach.data.sparse_powerlaw`) whose `density` is the sparsity knob.
Dense: the synthetic dense logistic problem. Each worker rebuilds the data (cached per process) and trains only on
its own contiguous shard of the training rows, so no data crosses the network and no row is used twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import scipy.sparse as sp

from .. import data as datasets

PROBLEMS = ("sparse", "dense")
DEFAULT_FEATURES = {"sparse": 20_000, "dense": 100}
#: Largest number of nonzeros a run may build: building takes ~40 bytes per nonzero at its peak, and a worker
#: process of a 2-worker cluster on a 2 GiB machine has ~750 MiB, ~430 MiB of which torch and numba already use.
MAX_NONZEROS = 4_000_000


@dataclass(frozen=True)
class DataSpec:
    """Which problem, how big, how sparse, and the seed that makes it reproducible (hashable: cache key)."""

    dataset: str
    n_samples: int
    n_features: int
    density: float
    seed: int
    skew: float = 1.1

    @property
    def nonzeros(self) -> int:
        """Approximate stored entries: what memory and time scale with."""
        per_row = self.n_features if self.dataset == "dense" else max(1, round(self.density * self.n_features))
        return self.n_samples * per_row


@dataclass(frozen=True)
class HogwildData:
    """Training and test rows (CSR float32 or dense float32) with float64 labels in {0, 1}."""

    spec: DataSpec
    X: sp.csr_matrix | np.ndarray
    y: np.ndarray
    X_test: sp.csr_matrix | np.ndarray
    y_test: np.ndarray

    @property
    def n_train(self) -> int:
        return self.X.shape[0]

    @property
    def n_features(self) -> int:
        return self.X.shape[1]

    @property
    def sparse(self) -> bool:
        return sp.issparse(self.X)

    def row_nonzeros(self, rows: np.ndarray) -> int:
        """Stored entries in the given rows (the counting experiment's intended number of increments)."""
        if not self.sparse:
            return int(len(rows) * self.n_features)
        return int(np.sum(np.diff(self.X.indptr)[rows]))


@lru_cache(maxsize=4)
def load_data(spec: DataSpec) -> HogwildData:
    """Build the problem for spec once per process (80 % training rows, 20 % test rows)."""
    if spec.dataset == "dense":
        full = datasets.dense_logistic(spec.n_samples, spec.n_features, seed=spec.seed)
        X = np.asarray(full.X, dtype=np.float32)
        # Unit-length rows, as in the sparse problem, so one learning rate suits both (labels keep their sign).
        X = np.ascontiguousarray(X / np.maximum(np.linalg.norm(X, axis=1, keepdims=True), 1e-12))
    else:
        full = datasets.sparse_powerlaw(
            spec.n_samples, spec.n_features, spec.density, seed=spec.seed, exponent=spec.skew
        )
        X = sp.csr_matrix(full.X, dtype=np.float32)
        X.sort_indices()
    cut = int(round(0.8 * X.shape[0]))
    y = full.y.astype(np.float64)
    return HogwildData(spec, X[:cut], y[:cut], X[cut:], y[cut:])


def kernel_arrays(data: HogwildData) -> tuple[np.ndarray, ...]:
    """The arrays the kernels take after `w`: (indptr, indices, values, y) or (X, y)."""
    if data.sparse:
        return data.X.indptr, data.X.indices, data.X.data, data.y
    return data.X, data.y


def shard_rows(n_train: int, rank: int, world: int) -> tuple[int, int]:
    """[start, stop) of rank's disjoint shard of the training rows."""
    return datasets.shard_bounds(n_train, rank, world)


def epoch_order(start: int, stop: int, epoch: int, seed: int, rank: int) -> np.ndarray:
    """Row indices of rank's shard in this epoch's shuffled order (a private generator per rank and epoch)."""
    rng = np.random.default_rng((seed, rank, epoch))
    return (start + rng.permutation(stop - start)).astype(np.int64)


def sparsity_stats(data: HogwildData) -> dict[str, float]:
    """Two of the paper's sparsity numbers for the training rows: Omega (most features in one row) and Delta
    (largest fraction of rows that touch one feature), plus the mean features per row."""
    if not data.sparse:
        return {"omega": float(data.n_features), "delta": 1.0, "mean_row_features": float(data.n_features)}
    X = data.X
    rows_per_feature = np.bincount(X.indices, minlength=data.n_features)
    return {
        "omega": float(np.diff(X.indptr).max()),
        "delta": float(rows_per_feature.max() / data.n_train),
        "mean_row_features": float(X.nnz / data.n_train),
    }
