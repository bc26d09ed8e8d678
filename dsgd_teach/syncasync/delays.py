"""Straggler models: how long a worker is held up, on purpose, at a given step (recorded as `injected_delay`).

Every delay is a deterministic function of (seed, rank, step), so a run can be replayed and a test can script the
arrival order. The delay is injected after the gradient is computed, so the trace separates real compute from
the straggling we added to study it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..config import check_choice, check_float, check_int, check_seed
from ..machine import MAX_WORKERS

STRAGGLER_MODELS = ("none", "exponential", "lognormal", "slow_worker")

#: Shape of the log-normal tail: median ~ 0.32 x mean, 99th percentile ~ 11 x mean (a heavy tail).
LOGNORMAL_SIGMA = 1.5


def fixed_delay(kind: str, severity: float, script: Sequence[Sequence[float]] | None, world: int, rank: int,
                step: int) -> float | None:
    """The delay of rank at step when no random draw decides it (a script, no straggler, the slow worker), else None.

    A script gives each rank's delay per step (0 after its end); the slow worker is always the last rank.
    """
    if script is not None:
        row = script[rank]
        return float(row[step]) if step < len(row) else 0.0
    if kind == "none" or severity == 0.0:
        return 0.0
    if kind == "slow_worker":
        return float(severity) if rank == world - 1 else 0.0
    return None


@dataclass(frozen=True)
class DelayModel:
    """Injected delay (seconds) per (rank, step): none, an exponential or log-normal tail, or one slow worker.

    `severity` is the mean extra delay in seconds for the random tails, and the fixed delay of the slow worker
    (the last rank). A `script` (per rank, a sequence of per-step delays; steps past its end get 0) overrides
    the model: tests use it to fix the arrival order.
    """

    kind: str = "none"
    severity: float = 0.0
    seed: int = 0
    world: int = 1
    script: tuple[tuple[float, ...], ...] | None = None

    def __post_init__(self) -> None:
        check_choice("straggler", self.kind, STRAGGLER_MODELS)
        check_float("severity", self.severity, 0.0, 10.0)
        check_seed(self.seed)
        check_int("world", self.world, 1, MAX_WORKERS)
        if self.script is not None:
            validate_script(self.script, self.world)

    def delay(self, rank: int, step: int) -> float:
        """Seconds of injected delay for rank at step (0.0 when there is none)."""
        fixed = fixed_delay(self.kind, self.severity, self.script, self.world, rank, step)
        if fixed is not None:
            return fixed
        rng = np.random.default_rng([self.seed, rank, step])
        if self.kind == "exponential":
            return float(rng.exponential(self.severity))
        z = rng.standard_normal()
        return float(self.severity * np.exp(LOGNORMAL_SIGMA * z - LOGNORMAL_SIGMA**2 / 2))


def validate_script(script: Sequence[Sequence[float]], world: int) -> None:
    """Raise ValueError unless script has one row of non-negative, finite delays (<= 10 s) per rank."""
    if len(script) != world:
        raise ValueError(f"delay_script must have one row per worker ({world}), got {len(script)}")
    for rank, row in enumerate(script):
        for step, value in enumerate(row):
            check_float(f"delay_script[{rank}][{step}]", value, 0.0, 10.0)


def as_script(rows: Sequence[Sequence[float]] | None) -> tuple[tuple[float, ...], ...] | None:
    """A hashable, frozen copy of a delay script (or None)."""
    return None if rows is None else tuple(tuple(float(v) for v in row) for row in rows)


def frozen_script(value: Any) -> tuple[tuple[float, ...], ...] | None:
    """A config's delay_script as the frozen form configs store; ValueError if it is not lists of seconds."""
    if value is None or isinstance(value, tuple):
        return value
    try:
        return as_script(value)
    except TypeError as exc:
        raise ValueError(f"delay_script must be a list of per-worker lists of seconds: {exc}") from exc
