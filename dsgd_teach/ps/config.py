"""The frozen configs of chapter 03: Downpour SGD and the synchronous parameter server it is contrasted with."""

from __future__ import annotations

from dataclasses import dataclass

from ..config import check_choice, check_float, check_int
from ..problem import TrainingConfig
from .optimizers import DEFAULT_DC_LAMBDA, OPTIMIZERS


@dataclass(frozen=True)
class PSConfig(TrainingConfig):
    """Fields shared by both parameter-server runs: problem, replicas, shards, server rule, faults, timeouts."""

    lr: float = 0.2
    steps: int = 200
    eval_every: int = 20
    replicas: int = 2
    shards: int = 2
    optimizer: str = "sgd"
    dc_lambda: float = DEFAULT_DC_LAMBDA
    checkpoint_every: int = 0
    timeout_s: float = 10.0

    def validate(self) -> None:
        super().validate()
        check_int("replicas", self.replicas, 1, 16)
        check_int("shards", self.shards, 1, 16)
        check_choice("optimizer", self.optimizer, OPTIMIZERS)
        check_float("dc_lambda", self.dc_lambda, 0.0, 1000.0)
        check_int("checkpoint_every", self.checkpoint_every, 0, 1_000_000)
        check_float("timeout_s", self.timeout_s, 0.5, 600.0)

    @property
    def workers(self) -> int:
        """Workers the run needs (one per replica; shards share them): the widget panel resizes to this."""
        return self.replicas


@dataclass(frozen=True)
class DownpourConfig(PSConfig):
    """Downpour SGD: each replica fetches every n_fetch of its steps and pushes its summed gradients every n_push.

    `steps` counts each replica's own minibatch steps. checkpoint_every > 0 makes every shard checkpoint after
    that many updates, so a shard whose worker dies is restored; with 0 such a run stops with an error.
    """

    n_fetch: int = 1
    n_push: int = 1

    def validate(self) -> None:
        super().validate()
        check_int("n_fetch", self.n_fetch, 1, self.steps)
        check_int("n_push", self.n_push, 1, self.steps)


@dataclass(frozen=True)
class SyncPSConfig(PSConfig):
    """Synchronous parameter server: every step all replicas push, each shard applies their mean, all wait."""
