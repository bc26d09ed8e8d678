"""ZeRO stage 3: stage 2 with the parameters sharded too (Rajbhandari et al. 2020, section 5.3).

A unit is all-gathered just before its forward and again before its backward, and freed after each, so a rank
holds the whole parameters of one unit at a time. Stages 0-2 are in `zero.py`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from .shard_ops import Pending, start_all_gather
from .zero import Stage2
from .zero_units import Unit, output_tensors, shard_parameters


class Stage3(Stage2, stage=3):
    """+ parameters sharded: a unit is all-gathered before its forward and its backward, and freed after each.

    Every rank must run the same modules in the same order (as FSDP asks), since each gather is a collective."""

    bucketed = False

    def __init__(self, model: torch.nn.Module, *args: Any, **kwargs: Any) -> None:
        super().__init__(model, *args, **kwargs)
        for u in self.units:
            for m in u.modules:
                m.register_forward_pre_hook(lambda m, a, u=u: self._gather(u))
                m.register_forward_hook(lambda m, a, out, u=u: self._after_forward(u, out))

    def _place(self, u: Unit) -> torch.Tensor:
        flat = u.flat([p.detach() for p in u.params])
        shard_parameters(self.model, u, self.comm.world)
        u.shard = flat[u.lo:u.lo + u.size].clone()
        u.full = torch.empty(u.padded, dtype=self.dtype, device=self.comm.device)
        for p, view in zip(u.params, u.views(u.full), strict=True):
            p.data = view
        self._free(u)
        return u.shard

    def _gather(self, u: Unit) -> None:
        if not u.gathered():
            u.full.untyped_storage().resize_(u.padded * u.full.element_size())
            pending = start_all_gather(self.comm, u.shard, self.how, self._pool, out=u.full)
            pending.wait()
            self._record(u, pending)
            self._tell("gathered")

    def _free(self, u: Unit) -> None:
        u.full.untyped_storage().resize_(0)

    def _after_forward(self, u: Unit, out: Any) -> None:
        self._free(u)
        for t in output_tensors(out):
            if t.requires_grad:
                t.register_hook(lambda g, u=u: self._gather(u))  # gathered again before its backward

    def _start(self, u: Unit) -> list[Any]:
        entry = super()._start(u)
        self._free(u)
        return entry

    def _spread(self, u: Unit, master: torch.Tensor) -> Pending | None:
        if master is not u.shard:  # mixed precision: the fp32 master rounded into the shard
            u.shard.copy_(master)
        return None

    @contextmanager
    def gathered(self) -> Iterator[None]:
        for u in self.units:
            self._gather(u)
        try:
            yield
        finally:
            for u in self.units:
                self._free(u)
