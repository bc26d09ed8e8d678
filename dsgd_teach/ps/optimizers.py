"""Server-side update rules, one instance per shard: plain SGD, or Adagrad as DistBelief ran it per parameter.

Each rule maps (values, gradient slice, step size) to *new* values without mutating the old array, so a shard can
hand its current array to a reader without copying it: a later update never changes what was already read.
"""

from __future__ import annotations

import numpy as np

OPTIMIZERS = ("sgd", "adagrad")


class ServerSGD:
    """w <- w - lr * g."""

    name = "sgd"

    def apply(self, values: np.ndarray, grad: np.ndarray, step: float) -> np.ndarray:
        """New values after one step of size `step` (lr times the push's scale), with a single allocation.

        (-step * g) + w equals w - step * g bit for bit: negation is exact in floating point.
        """
        new = np.multiply(grad, np.float32(-step), dtype=np.float32)
        new += values
        return new

    def state(self) -> dict[str, np.ndarray]:
        """Arrays a checkpoint must keep (none for SGD)."""
        return {}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        """Restore from a checkpoint's arrays."""


class ServerAdagrad:
    """Adagrad (Duchi et al. 2011): per-coordinate step lr / sqrt(sum of squared gradients seen so far).

    Coordinates that receive many large gradients slow down and rare ones keep a large step, which is why
    DistBelief found it stabilised Downpour: a burst of stale gradients on one coordinate damps itself.
    """

    name = "adagrad"

    def __init__(self, size: int, initial_accumulator: float = 0.1, eps: float = 1e-10) -> None:
        self.accum = np.full(size, initial_accumulator, dtype=np.float32)
        self.eps = np.float32(eps)

    def apply(self, values: np.ndarray, grad: np.ndarray, step: float) -> np.ndarray:
        """New values after one Adagrad step; the accumulator is updated in place (it is never shared)."""
        self.accum += grad * grad
        return values - np.float32(step) * grad / (np.sqrt(self.accum) + self.eps)

    def state(self) -> dict[str, np.ndarray]:
        """The accumulator (a checkpoint without it would restart every step size)."""
        return {"accum": self.accum.copy()}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        """Restore the accumulator."""
        self.accum = np.asarray(state["accum"], dtype=np.float32).copy()


def make_optimizer(name: str, size: int) -> ServerSGD | ServerAdagrad:
    """The update rule called name for a shard of `size` coordinates."""
    if name == "sgd":
        return ServerSGD()
    if name == "adagrad":
        return ServerAdagrad(size)
    raise ValueError(f"optimizer must be one of {', '.join(map(repr, OPTIMIZERS))}; got {name!r}")
