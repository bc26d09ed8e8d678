"""How long a simulated worker computes: a base compute time with optional jitter, plus chapter 04's stragglers.

Up to MAX_WORKERS (64) workers the injected delays are chapter 04's own DelayModel (same seed, rank and step give
the same delay as on the real cluster), so a simulated run and a real one see identical stragglers. Beyond that one generator
per step draws every rank's delay at once from the same distributions (DelayModel's per-(rank, step) generator
would cost more than the rest of the simulation); the slow worker is always the last rank.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from ..machine import MAX_WORKERS
from ..syncasync.delays import (
    LOGNORMAL_SIGMA,
    STRAGGLER_MODELS,
    DelayModel,
    as_script,
    fixed_delay,
    frozen_script,
    validate_script,
)

__all__ = ["STRAGGLER_MODELS", "SimDelays", "as_script", "frozen_script", "validate_script"]

EXACT_WORLD = MAX_WORKERS  # up to this many workers (the most DelayModel takes), delays are its draws exactly
_CACHE_STEPS = 4096


@dataclass
class SimDelays:
    """Compute seconds and injected straggler seconds for (rank, step), deterministic in the seed."""

    kind: str
    severity: float
    seed: int
    world: int
    script: tuple[tuple[float, ...], ...] | None = None
    compute_s: float = 0.0
    compute_cv: float = 0.0
    _cache: OrderedDict = field(default_factory=OrderedDict, repr=False)

    def __post_init__(self) -> None:
        if self.world <= EXACT_WORLD:
            self._model: DelayModel | None = DelayModel(self.kind, self.severity, self.seed, self.world, None)
        else:
            DelayModel(self.kind, self.severity, self.seed, 1, None)  # same validation of kind and severity
            self._model = None

    def injected(self, rank: int, step: int) -> float:
        """Straggler delay (seconds) of rank at step: the script if any, else chapter 04's model."""
        fixed = fixed_delay(self.kind, self.severity, self.script, self.world, rank, step)
        if fixed is not None:
            return fixed
        if self._model is not None:
            return self._model.delay(rank, step)
        return float(self._draws(step, "delay")[rank])

    def compute(self, rank: int, step: int) -> float:
        """Seconds of real work for rank's gradient at step: compute_s, log-normally jittered when compute_cv > 0.

        The jitter has median compute_s and log-space standard deviation compute_cv, drawn from a generator keyed
        on (seed, step), so it is reproducible and independent of the order events happen in.
        """
        if self.compute_cv == 0.0 or self.compute_s == 0.0:
            return self.compute_s
        return float(self.compute_s * np.exp(self.compute_cv * self._draws(step, "jitter")[rank]))

    def _draws(self, step: int, what: str) -> np.ndarray:
        """One vector per (step, what) over all ranks, cached for the ranks that ask next."""
        key = (step, what)
        out = self._cache.get(key)
        if out is None:
            rng = np.random.default_rng([self.seed, step, 1 if what == "delay" else 2])
            if what == "jitter":
                out = rng.standard_normal(self.world)
            elif self.kind == "exponential":
                out = rng.exponential(self.severity, self.world)
            else:
                z = rng.standard_normal(self.world)
                out = self.severity * np.exp(LOGNORMAL_SIGMA * z - LOGNORMAL_SIGMA**2 / 2)
            self._cache[key] = out
            if len(self._cache) > _CACHE_STEPS:
                self._cache.popitem(last=False)
        return out


def delays_of(config) -> SimDelays:  # noqa: ANN001 - a SimConfig (importing it here would be circular)
    """The delay model of a SimConfig."""
    return SimDelays(
        config.straggler, config.severity, config.seed, config.world, config.delay_script,
        config.compute_s, config.compute_cv,
    )
