"""Frozen, validated configs of the chapter's two experiments: Hogwild SGD and the lost-update counter."""

from __future__ import annotations

from dataclasses import dataclass

from ..config import Config, check_bool, check_choice, check_float, check_int, check_seed
from .problem import DEFAULT_FEATURES, MAX_NONZEROS, PROBLEMS, DataSpec

BACKENDS = ("processes", "threads")


def _check_size(spec: DataSpec) -> None:
    """Refuse problems too big for a laptop, naming the fields to shrink."""
    if spec.nonzeros > MAX_NONZEROS:
        raise ValueError(
            f"n_samples * n_features * density = {spec.nonzeros:,} stored entries; the limit is {MAX_NONZEROS:,} "
            "(lower n_samples, n_features or density)"
        )


@dataclass(frozen=True)
class _SharedFields(Config):
    """Fields both experiments share: the data, the parallelism, the seed.

    density is the fraction of features a sparse row touches; skew is the power-law exponent of how often each
    feature is used: 0 spreads rows evenly over the features (rare collisions), 1.1 is word-like (a few features
    are in almost every row, so concurrent updates keep writing the same memory).
    """

    dataset: str = "sparse"
    n_samples: int = 50_000
    n_features: int | None = None
    density: float = 0.001
    skew: float = 1.1
    workers: int = 2
    backend: str = "processes"
    lock: bool = False
    seed: int = 0
    timeout_s: float = 300.0

    def validate(self) -> None:
        check_choice("dataset", self.dataset, PROBLEMS)
        check_int("n_samples", self.n_samples, 100, 2_000_000)
        if self.n_features is not None:
            check_int("n_features", self.n_features, 2, 2_000_000)
        check_float("density", self.density, 0.0, 1.0, lo_open=True)
        check_float("skew", self.skew, 0.0, 3.0)
        check_int("workers", self.workers, 1, 64)
        check_choice("backend", self.backend, BACKENDS)
        check_bool("lock", self.lock)
        check_seed(self.seed)
        check_float("timeout_s", self.timeout_s, 1.0, 86_400.0)
        _check_size(self.data_spec)

    @property
    def data_spec(self) -> DataSpec:
        """The problem's identity (workers rebuild the data from it)."""
        features = self.n_features or DEFAULT_FEATURES[self.dataset]
        if self.dataset == "dense":
            return DataSpec(self.dataset, self.n_samples, features, 1.0, self.seed, 0.0)
        return DataSpec(self.dataset, self.n_samples, features, self.density, self.seed, self.skew)


@dataclass(frozen=True)
class HogwildConfig(_SharedFields):
    """Hogwild SGD for logistic regression: `workers` processes (or threads) update one shared vector.

    Each worker makes `epochs` passes over its own shard; the step size in epoch k is lr * lr_decay**k (the
    paper's backoff). lock=True takes a shared mutex around every update; round_robin=True makes the workers
    take turns, one update each in rank order (the paper's other synchronising baseline); workers=1 is plain
    sequential SGD. report_every is the number of updates per kernel call (and at most one progress event per call).
    """

    lr: float = 0.5
    lr_decay: float = 1.0
    epochs: int = 5
    report_every: int = 5_000
    round_robin: bool = False

    def validate(self) -> None:
        super().validate()
        check_bool("round_robin", self.round_robin)
        if self.round_robin and self.lock:
            raise ValueError("round_robin=True and lock=True: choose one way to coordinate the workers (or neither)")
        check_float("lr", self.lr, 0.0, 100.0, lo_open=True)
        check_float("lr_decay", self.lr_decay, 0.0, 1.0, lo_open=True)
        check_int("epochs", self.epochs, 1, 10_000)
        check_int("report_every", self.report_every, 1, 10_000_000)

    @property
    def scheme(self) -> str:
        """How the workers coordinate their writes: 'lock-free' (Hogwild), 'locked' or 'round-robin'."""
        return "round-robin" if self.round_robin else "locked" if self.lock else "lock-free"


@dataclass(frozen=True)
class CountingConfig(_SharedFields):
    """The lost-update experiment: every worker adds 1 to counts[j] for each nonzero j of its rows, `passes` times.

    Without a lock, two workers that read-modify-write the same counter at once lose one increment; the
    shortfall between intended and landed increments counts the collisions Hogwild tolerates.
    """

    n_samples: int = 20_000
    n_features: int | None = 1_000
    density: float = 0.01
    passes: int = 100

    def validate(self) -> None:
        super().validate()
        check_int("passes", self.passes, 1, 100_000)
