"""Client partitions for federated learning: uneven client sizes, IID or non-IID (one or two digit classes each).

Every process rebuilds the same partitions from the problem's seed, so a client's data never crosses the
network: only its row indices are computed where the client runs, as on a phone that already holds its photos.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from ..config import check_choice, check_float, check_int
from ..problem import ProblemSpec, get_problem

PARTITIONS = ("iid", "non-iid")


def client_sizes(n_samples: int, clients: int, skew: float, seed: int) -> np.ndarray:
    """Rows per client, summing to n_samples: a linear ramp where the largest is about (1 + skew) x the smallest,
    shuffled by seed; skew = 0 gives equal clients (up to one row)."""
    check_int("clients", clients, 1, n_samples)
    check_float("skew", skew, 0.0, 100.0)
    weights = 1.0 + skew * np.linspace(0.0, 1.0, clients)
    sizes = np.maximum(1, np.floor(weights / weights.sum() * n_samples)).astype(np.int64)
    largest_first = np.argsort(-weights, kind="stable")
    while sizes.sum() > n_samples:  # the floor of 1 row may overshoot: take rows back from the largest
        sizes[largest_first[np.argmax(sizes[largest_first])]] -= 1
    for i in range(n_samples - int(sizes.sum())):  # rows lost to rounding go to the largest clients
        sizes[largest_first[i % clients]] += 1
    return np.random.default_rng([seed, 7]).permutation(sizes)


def split_rows(labels: np.ndarray, clients: int, partition: str, skew: float, seed: int) -> list[np.ndarray]:
    """Row indices of each client. "iid": a random permutation cut into the client sizes. "non-iid": rows
    sorted by label, then cut into consecutive runs, so a client smaller than a class holds one or two digits."""
    check_choice("partition", partition, PARTITIONS)
    rng = np.random.default_rng([seed, 11])
    n = len(labels)
    sizes = client_sizes(n, clients, skew, seed)
    if partition == "iid":
        order = rng.permutation(n)
    else:
        order = np.lexsort((rng.permutation(n), labels))  # by label, random order inside a label
    cuts = np.cumsum(sizes)[:-1]
    return [np.sort(part) for part in np.split(order, cuts)]


@lru_cache(maxsize=16)
def client_rows(spec: ProblemSpec, clients: int, partition: str, skew: float) -> tuple[np.ndarray, ...]:
    """The partition of spec's training set (cached per process; the same on the driver and every worker)."""
    labels = get_problem(spec).train.y
    return tuple(split_rows(labels, clients, partition, skew, spec.seed))


def describe(spec: ProblemSpec, clients: int, partition: str, skew: float) -> list[dict[str, object]]:
    """One row per client: its size and the digit classes it holds (for a table in the chapter)."""
    labels = get_problem(spec).train.y
    return [
        {"client": k, "rows": len(rows), "classes": sorted(int(c) for c in np.unique(labels[rows]))}
        for k, rows in enumerate(client_rows(spec, clients, partition, skew))
    ]
