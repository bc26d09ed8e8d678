"""fp16's dynamic loss scaling (Micikevicius et al. 2018, section 3.2), as ZeroAdam applies it."""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..runtime.ranks.comm import Comm
from .zero_units import Unit


class LossScaler:
    """fp16's dynamic loss scaling (Micikevicius et al. 2018, section 3.2): halve and skip on overflow, else grow."""

    def __init__(self, scale: float = 2.0**16, growth_interval: int = 100) -> None:
        self.scale, self.growth_interval, self.good_steps, self.skipped = scale, growth_interval, 0, 0

    def update(self, overflow: bool) -> None:
        """Halve the scale after an overflow; double it after growth_interval clean steps."""
        if overflow:
            self.scale, self.good_steps, self.skipped = self.scale / 2, 0, self.skipped + 1
        else:
            self.good_steps += 1
            if self.good_steps % self.growth_interval == 0:
                self.scale *= 2

    def step_ok(self, overflow: bool) -> bool:
        """Learn whether this step overflowed; True when the step may be taken."""
        self.update(overflow)
        return not overflow


def overflow_on_any_rank(comm: Comm, units: list[Unit]) -> bool:
    """fp16: every rank votes on whether any of its gradient shards holds an inf or a NaN (one tiny allreduce)."""
    bad = torch.tensor([float(any(not torch.isfinite(u.grad_shard).all() for u in units))], device=comm.device)
    comm.wait_all([dist.all_reduce(bad, op=dist.ReduceOp.MAX, async_op=True)], "the overflow vote")
    return bool(bad.item() > 0)
