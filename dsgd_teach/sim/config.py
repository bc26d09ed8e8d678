"""The simulator's config: the chapters' own field names (workers, backups, straggler, staleness_bound, ...)
plus the few numbers a model of the machine needs (compute time, latency, bandwidth), up to 1000 workers.

`from_config` turns any real run's config (chapter 01, 03, 04 or 05) into a SimConfig with the same values, so a
simulated run and a real one are driven by the same settings and a widget control named `workers` means the same
thing on both sides.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from ..collectives.algorithms import resolve
from ..config import check_bool, check_choice, check_float, check_int
from ..problem import TrainingConfig
from ..ps.optimizers import DEFAULT_DC_LAMBDA, OPTIMIZERS
from .delays import STRAGGLER_MODELS, frozen_script, validate_script

MAX_SIM_WORKERS = 1000
#: Asynchronous runs may go further: delays of thousands of updates need thousands of workers.
MAX_ASYNC_SIM_WORKERS = 10_000
ALGORITHMS = ("sync", "async", "allreduce")
COMMS = ("naive", "doubling", "ring")  # naive = a central server (gather, then broadcast); doubling = a butterfly
MODES = ("timing", "real")


@dataclass(frozen=True)
class SimConfig(TrainingConfig):
    """A simulated run: sync SGD (with backups), async SGD (staleness rule, bound), or one allreduce timing.

    mode="real" applies real gradients of the chapter's model at the simulated times; mode="timing" only moves
    the clocks (fast enough for 1000 workers). For algorithm="allreduce", `steps` is the number of repeats and
    `elements` the vector length. bandwidth_Bps=None means an infinitely fast link. `optimizer` is the server's
    update rule (chapter 03's OPTIMIZERS, fed the staleness the simulated server observes); asynchronous runs
    take up to 10 000 workers.
    """

    algorithm: str = "sync"
    comm: str = "naive"
    mode: str = "timing"
    workers: int = 2
    backups: int = 0
    straggler: str = "none"
    severity: float = 0.0
    delay_script: tuple[tuple[float, ...], ...] | None = None
    staleness_aware: bool = False
    staleness_bound: int | None = None
    optimizer: str = "sgd"
    dc_lambda: float = DEFAULT_DC_LAMBDA
    compression: bool = False
    shards: int = 1
    compute_s: float = 0.005
    compute_cv: float = 0.0
    alpha_s: float = 1e-4
    bandwidth_Bps: float | None = 1e9
    server_s: float = 0.0
    elements: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "delay_script", frozen_script(self.delay_script))
        object.__setattr__(self, "comm", _canonical_comm(self.comm))
        super().__post_init__()

    def validate(self) -> None:
        check_choice("algorithm", self.algorithm, ALGORITHMS)
        check_choice("comm", self.comm, COMMS)
        check_choice("mode", self.mode, MODES)
        super().validate()
        check_int("workers", self.workers, 1, MAX_ASYNC_SIM_WORKERS if self.algorithm == "async" else MAX_SIM_WORKERS)
        check_int("backups", self.backups, 0, self.workers)
        check_choice("straggler", self.straggler, STRAGGLER_MODELS)
        check_float("severity", self.severity, 0.0, 10.0)
        if self.delay_script is not None:
            validate_script(self.delay_script, self.world)
        check_bool("staleness_aware", self.staleness_aware)
        if self.staleness_bound is not None:
            check_int("staleness_bound", self.staleness_bound, 0, 1_000_000)
        check_choice("optimizer", self.optimizer, OPTIMIZERS)
        check_float("dc_lambda", self.dc_lambda, 0.0, 1000.0)
        if self.staleness_aware and self.optimizer not in ("sgd", "staleness_aware"):
            raise ValueError(
                f"staleness_aware=True is optimizer='staleness_aware'; it cannot be combined with {self.optimizer!r}"
            )
        check_bool("compression", self.compression)
        check_int("shards", self.shards, 1, 1024)
        check_float("compute_s", self.compute_s, 0.0, 3600.0)
        check_float("compute_cv", self.compute_cv, 0.0, 5.0)
        check_float("alpha_s", self.alpha_s, 0.0, 60.0)
        if self.bandwidth_Bps is not None:
            check_float("bandwidth_Bps", self.bandwidth_Bps, 0.0, 1e12, lo_open=True, hi_open=True)
        check_float("server_s", self.server_s, 0.0, 60.0)
        if self.elements is not None:
            check_int("elements", self.elements, 0, 1 << 34)
        if self.mode == "real" and self.algorithm == "allreduce":
            raise ValueError("mode='real' needs algorithm 'sync' or 'async' (an allreduce alone has no model)")
        if self.algorithm == "allreduce" and self.elements is None:
            raise ValueError("algorithm='allreduce' needs elements (the vector length to reduce)")

    @property
    def rule(self) -> str:
        """The server's update rule (staleness_aware=True selects 'staleness_aware')."""
        return "staleness_aware" if self.staleness_aware else self.optimizer

    @property
    def world(self) -> int:
        """Worker processes simulated: the backups run only in synchronous SGD."""
        return self.workers + (self.backups if self.algorithm == "sync" else 0)


def _common(config: Any) -> dict[str, Any]:
    """Fields of config that SimConfig also has, by name."""
    names = {f.name for f in fields(SimConfig)}
    return {f.name: getattr(config, f.name) for f in fields(config) if f.name in names}


def from_config(config: Any, **overrides: Any) -> SimConfig:
    """The SimConfig that simulates a real run's config (same field values), with sim fields in overrides.

    Knows chapter 01's DataParallelConfig/SGDConfig, chapter 03's Downpour/SyncPS configs, chapter 04's
    SyncConfig/AsyncConfig and chapter 05's AllreduceConfig/AllreduceSGDConfig; a SimConfig is just updated.
    """
    if isinstance(config, SimConfig):
        return config.replace(**overrides)  # type: ignore[return-value]
    name = type(config).__name__
    values = _common(config)
    values.pop("algorithm", None)
    if name in ("SyncConfig", "DataParallelConfig", "SGDConfig"):
        values["algorithm"] = "sync"
        if name == "SGDConfig":
            values["workers"] = 1
    elif name == "AsyncConfig":
        values["algorithm"] = "async"
    elif name in ("DownpourConfig", "SyncPSConfig"):
        values.update(workers=config.replicas, shards=config.shards)
        if name == "DownpourConfig":
            values.update(algorithm="async", steps=max(1, config.steps * config.replicas // config.n_push))
        else:
            values["algorithm"] = "sync"
    elif name == "AllreduceConfig":
        values.update(algorithm="allreduce", comm=_comm_of(config.algorithm), steps=config.repeats)
    elif name == "AllreduceSGDConfig":
        values.update(algorithm="sync", comm=_comm_of(config.allreduce))
    else:
        raise ValueError(f"don't know how to simulate a {name}; pass a SimConfig")
    return SimConfig(**{**values, **overrides})


def _canonical_comm(comm: object) -> object:
    """comm with chapter 05's old alias resolved: "tree" was the first name of recursive doubling (a butterfly)."""
    return resolve(comm) if isinstance(comm, str) else comm


def _comm_of(algorithm: str) -> str:
    """The simulated schedule of a chapter-05 algorithm name (the library's all_reduce is a ring)."""
    algorithm = resolve(algorithm)
    return algorithm if algorithm in COMMS else "ring"
