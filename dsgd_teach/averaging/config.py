"""Configs of chapter 08: local SGD (periodic averaging), elastic averaging, federated averaging."""

from __future__ import annotations

from dataclasses import dataclass

from ..collectives.algorithms import ALGORITHMS
from ..config import check_choice, check_float, check_int, check_timeout
from ..problem import TrainingConfig
from ..sgd import DataParallelConfig
from .partitions import PARTITIONS


@dataclass(frozen=True)
class LocalSGDConfig(DataParallelConfig):
    """`workers` replicas each take `steps` local SGD steps on their shard, averaging parameters every
    `sync_every` (H) steps with an allreduce; H = 1 is synchronous data-parallel SGD. When a replica's worker
    dies, "regroup" (`on_worker_lost`) goes on with the others from the last average; "raise" stops the run."""

    steps: int = 240
    sync_every: int = 8
    allreduce: str = "ring"
    timeout_s: float = 30.0
    run_timeout_s: float = 600.0
    on_worker_lost: str = "regroup"

    def validate(self) -> None:
        super().validate()
        check_int("workers", self.workers, 1, 16)
        check_int("sync_every", self.sync_every, 1, 10_000)
        check_choice("allreduce", self.allreduce, tuple(ALGORITHMS))
        check_timeout("timeout_s", self.timeout_s)
        check_timeout("run_timeout_s", self.run_timeout_s, 86400.0)
        check_choice("on_worker_lost", self.on_worker_lost, ("raise", "regroup"))


@dataclass(frozen=True)
class EASGDConfig(DataParallelConfig):
    """Elastic averaging SGD (Zhang, Choromanska & LeCun 2015): every `sync_every` steps a worker and the center
    variable on a parameter-server actor pull towards each other by `alpha` times their difference."""

    steps: int = 240
    sync_every: int = 4
    alpha: float = 0.2
    timeout_s: float = 10.0

    def validate(self) -> None:
        super().validate()
        check_int("workers", self.workers, 1, 16)
        check_int("sync_every", self.sync_every, 1, 10_000)
        check_float("alpha", self.alpha, 0.0, 1.0, lo_open=True)
        check_timeout("timeout_s", self.timeout_s)


FED_ALGORITHMS = ("fedavg", "fedsgd")


@dataclass(frozen=True)
class FedAvgConfig(TrainingConfig):
    """Federated averaging (McMahan et al. 2017) over `clients` data partitions for `steps` communication rounds.

    Each round a fraction C (`fraction`) of the clients is sampled; each trains `local_epochs` (E) epochs of
    minibatch SGD with `batch_size` (B; B >= a client's rows is full batch) from the global model, and the server
    averages the returned models weighted by the clients' sample counts. "fedsgd" makes every client take one
    full-batch step instead (the baseline). `dropout` is the chance that a sampled client quits mid-round,
    `prox_mu` FedProx's proximal term (Li et al. 2020), `target_accuracy` stops at that test accuracy (0: never),
    `client_delay_s` an injected wait at the end of every client's work (labelled in the trace).
    """

    algorithm: str = "fedavg"
    steps: int = 50
    clients: int = 20
    fraction: float = 0.5
    local_epochs: int = 5
    batch_size: int = 10
    lr: float = 0.1
    partition: str = "non-iid"
    size_skew: float = 3.0
    dropout: float = 0.0
    prox_mu: float = 0.0
    target_accuracy: float = 0.0
    eval_every: int = 1
    round_timeout_s: float = 60.0
    client_delay_s: float = 0.0

    def validate(self) -> None:
        super().validate()
        check_choice("algorithm", self.algorithm, FED_ALGORITHMS)
        check_int("clients", self.clients, 1, 10_000)
        check_float("fraction", self.fraction, 0.0, 1.0, lo_open=True)
        check_int("local_epochs", self.local_epochs, 1, 1000)
        check_choice("partition", self.partition, PARTITIONS)
        check_float("size_skew", self.size_skew, 0.0, 100.0)
        check_float("dropout", self.dropout, 0.0, 1.0, hi_open=True)
        check_float("prox_mu", self.prox_mu, 0.0, 100.0)
        check_float("target_accuracy", self.target_accuracy, 0.0, 1.0)
        check_float("round_timeout_s", self.round_timeout_s, 0.0, 3600.0, lo_open=True)
        check_float("client_delay_s", self.client_delay_s, 0.0, 60.0)

    @property
    def clients_per_round(self) -> int:
        """m = max(1, round(C N_c)) clients sampled each round."""
        return max(1, int(round(self.fraction * self.clients)))
