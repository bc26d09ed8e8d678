"""A learning problem (data set + model) built identically, and cached, in whichever process asks for it."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from torch import nn

from . import data as datasets
from .config import Config, check_choice, check_float, check_int, check_seed
from .models import MODELS, build_model, default_device, evaluate, get_flat


@dataclass(frozen=True)
class ProblemSpec:
    """Which data set and model, with the seed that makes both deterministic; hashable so workers can cache."""

    dataset: str = "digits"
    model: str = "logreg"
    seed: int = 0
    n_samples: int | None = None
    density: float = 0.001

    def __post_init__(self) -> None:
        check_choice("dataset", self.dataset, datasets.DATASETS)
        check_choice("model", self.model, MODELS)
        check_seed(self.seed)
        if self.n_samples is not None:
            check_int("n_samples", self.n_samples, 10, 1_000_000)
        check_float("density", self.density, 0.0, 1.0, lo_open=True)


def check_training_fields(config: object) -> None:
    """Validate the fields every training config shares (problem, step size, batch, steps, evaluation, seed)."""
    check_choice("dataset", config.dataset, datasets.DATASETS)
    check_choice("model", config.model, MODELS)
    check_float("lr", config.lr, 0.0, 100.0, lo_open=True)
    check_int("batch_size", config.batch_size, 1, 1_000_000)
    check_int("steps", config.steps, 1, 1_000_000)
    check_int("eval_every", config.eval_every, 1, 1_000_000)
    check_seed(config.seed)
    if config.n_samples is not None:
        check_int("n_samples", config.n_samples, 10, 1_000_000)


@dataclass(frozen=True)
class TrainingConfig(Config):
    """Fields every gradient-training experiment shares (problem, step size, batch, budget, evaluation, seed);
    chapters subclass it, adding their own fields and changing defaults by declaring a field again."""

    dataset: str = "digits"
    model: str = "logreg"
    lr: float = 0.5
    batch_size: int = 32
    steps: int = 100
    eval_every: int = 10
    seed: int = 0
    n_samples: int | None = None

    def validate(self) -> None:
        check_training_fields(self)

    @property
    def problem(self) -> ProblemSpec:
        """The data set and model this run trains, as workers rebuild it."""
        return ProblemSpec(self.dataset, self.model, self.seed, self.n_samples)


@dataclass(frozen=True)
class Problem:
    """Train and test splits, a model to evaluate with, and the initial flat parameters."""

    spec: ProblemSpec
    train: datasets.Dataset
    test: datasets.Dataset
    model: nn.Module
    init_params: np.ndarray

    def train_shard(self, rank: int, world: int) -> datasets.Dataset:
        """Rank's disjoint slice of the training set."""
        return datasets.shard(self.train, rank, world)

    def evaluate(self, params: np.ndarray) -> dict[str, float]:
        """Full training loss and held-out accuracy of params."""
        train_loss, _ = evaluate(self.model, params, self.train.X, self.train.y)
        _, test_acc = evaluate(self.model, params, self.test.X, self.test.y)
        return {"train_loss": train_loss, "test_accuracy": test_acc}


@lru_cache(maxsize=8)
def get_problem(spec: ProblemSpec) -> Problem:
    """Build the problem for spec once per process (workers rebuild it from the seed; no data is shipped)."""
    full = datasets.load(spec.dataset, spec.seed, spec.n_samples, spec.density)
    train, test = datasets.train_test_split(full)
    model = build_model(spec.model, full.n_features, full.n_classes, seed=spec.seed).to(default_device())
    return Problem(spec, train, test, model, get_flat(model))
