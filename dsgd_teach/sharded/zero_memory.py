"""What a ZeRO rank holds, counted apart from the algorithm: parameters, gradients and optimizer state, in bytes.

`HeldMemory.watch(zero)` attaches a meter to a ZeroAdam, which tells its watchers of the moments its holdings may
peak (a collective about to start, a stage-3 gather, the optimizer step); the meter keeps the largest total seen
and the holdings at the last optimizer step, which chapter 09 sets against Rajbhandari et al.'s formulas (2020,
section 5, Figure 1).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .zero_units import Unit


def _nbytes(t: torch.Tensor | None) -> int:
    """Bytes of a tensor's elements (0 for None)."""
    return 0 if t is None else t.numel() * t.element_size()


class HeldMemory:
    """Bytes of the model states a ZeroAdam holds; `peak` since it was last reset and `at_step`, the last step's."""

    def __init__(self, units: list[Unit], masters: list[torch.Tensor], opt: torch.optim.Optimizer,
                 in_flight: Callable[[], list[list[Any]]], masters_apart: bool) -> None:
        self.units, self.masters, self.opt, self.in_flight = units, masters, opt, in_flight
        self.masters_apart = masters_apart  # mixed precision: Adam's fp32 masters are copies apart
        self.peak = 0
        self.at_step: dict[str, int] = {}

    @classmethod
    def watch(cls, zero: Any) -> HeldMemory:
        """A meter told of every moment of zero (a ZeroAdam): sampled at each, kept as `at_step` at each step."""
        meter = cls(zero.units, zero.masters, zero.opt, lambda: zero.in_flight,
                    masters_apart=zero.dtype != torch.float32)
        zero.watchers.append(meter.on)
        return meter

    def on(self, moment: str) -> None:
        """Sample now; at the optimizer step, keep the sample as `at_step`."""
        if moment == "step":
            self.sample_step()
        else:
            self.sample()

    def sample(self) -> dict[str, int]:
        """The bytes held right now, by kind, and their total; raises the peak if it is a new one."""
        params = grads = 0
        for u in self.units:
            params += u.full.untyped_storage().nbytes() + _nbytes(u.shard)
            if u.grad_full is not None:
                grads += _nbytes(u.grad_full)
            else:
                grads += sum(_nbytes(p.grad) for p in u.params) + _nbytes(u.grad_shard)
        pending = self.in_flight()
        grads += sum(_nbytes(flat) for _, _, flat in pending)  # full gradients being reduce-scattered
        grads += sum(_nbytes(p.received) for _, p, _ in pending)  # a direct reduce-scatter's receive buffer
        optim = sum(_nbytes(m) for m in self.masters) if self.masters_apart else 0
        for state in self.opt.state.values():
            optim += sum(_nbytes(t) for t in state.values() if torch.is_tensor(t) and t.dim())
        held = {"params": params, "grads": grads, "optimizer": optim, "total": params + grads + optim}
        self.peak = max(self.peak, held["total"])
        return held

    def sample_step(self) -> None:
        """Sample at the optimizer step and keep it as `at_step`."""
        self.at_step = self.sample()
