"""Client partitions for federated learning: uneven client sizes, IID or non-IID (one or two digit classes each).

Client sizes follow a linear ramp (the largest about 1 + skew times the smallest). Every process rebuilds the same partitions from the problem's seed, so a client's data never crosses the
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
    """Row indices of each client, with uneven client sizes. "iid": a random permutation cut into the client
    sizes. "non-iid" (McMahan et al.'s pathological split): each class is cut into pieces, and every client gets
    two pieces drawn at random, so it holds one or two digits."""
    check_choice("partition", partition, PARTITIONS)
    rng = np.random.default_rng([seed, 11])
    n = len(labels)
    if partition == "iid":
        cuts = np.cumsum(client_sizes(n, clients, skew, seed))[:-1]
        return [np.sort(part) for part in np.split(rng.permutation(n), cuts)]
    classes = np.unique(labels)
    pieces: list[np.ndarray] = []
    per_class = np.diff(np.linspace(0, 2 * clients, len(classes) + 1).round().astype(int))
    for c, count in zip(classes, per_class, strict=True):  # 2K pieces in all, spread over the classes
        rows = rng.permutation(np.flatnonzero(labels == c))
        if count:
            sizes = client_sizes(len(rows), int(count), skew, seed + int(c))
            pieces += np.split(rows, np.cumsum(sizes)[:-1])
        elif pieces:
            pieces[-1] = np.concatenate([pieces[-1], rows])
    order = rng.permutation(len(pieces))
    return [np.sort(np.concatenate([pieces[i] for i in order[2 * k : 2 * k + 2]])) for k in range(clients)]


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
