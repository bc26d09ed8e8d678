"""ZeRO stages 0-2 with Adam, each a small step on the last (Rajbhandari et al. 2020, section 5); stage 3 follows.

Stage 0 is data parallelism with Adam: every rank holds everything and allreduces the gradients. Stage 1 shards
Adam's state: the gradient is reduce-scattered, each rank steps on its own shard, and the new parameters are
all-gathered. Stage 2 also shards the gradient: the full gradient is freed as soon as it is reduce-scattered. Stage
3 also shards the parameters: a unit is all-gathered just before its forward and its backward, and freed after
each (`zero_stage3.py`). `ZeroAdam(model, comm, stage=s)` builds stage s; what the stages share (the step's
outline) is in `zero_base.py`.

In fp32 the parameters are Adam's master copy; in bf16/fp16 an fp32 master copy of this rank's part is kept apart,
as Rajbhandari et al. count it (K = 12).
"""

from __future__ import annotations

from typing import Any

import torch

from .loss_scaler import LossScaler
from .shard_ops import Pending, start_all_gather, start_all_reduce, start_reduce_scatter
from .zero_base import DTYPES, ZeroAdam
from .zero_formulas import activation_meter, traffic_formula, zero_formula
from .zero_units import Unit

#: Stages 2-3 wait for the oldest reduce-scatter before starting one more than this: the full gradients they hold.
IN_FLIGHT = 1
__all__ = ["DTYPES", "LossScaler", "Stage0", "Stage1", "Stage2", "ZeroAdam", "activation_meter", "traffic_formula", "zero_formula"]


class Stage0(ZeroAdam, stage=0):
    """Data parallelism with Adam: every rank holds all parameters, gradients and Adam's state; allreduce."""

    def _place(self, u: Unit) -> torch.Tensor:
        u.full = u.flat([p.detach() for p in u.params])
        for p, view in zip(u.params, u.views(u.full), strict=True):
            p.data = view
        self._hold_gradient(u)
        return u.full

    def _hold_gradient(self, u: Unit) -> None:
        """A flat buffer for the unit's whole gradient, each parameter's .grad a view of it."""
        u.grad_full = torch.zeros_like(u.full)
        for p, view in zip(u.params, u.views(u.grad_full), strict=True):
            p.grad = view

    def _gradient_in_buffer(self, u: Unit) -> torch.Tensor:
        """The unit's gradient in its flat buffer (a gradient set to None counts as zeros, a replaced one is copied)."""
        assert u.grad_full is not None
        for p, view in zip(u.params, u.views(u.grad_full), strict=True):
            if p.grad is None:
                view.zero_()
            elif p.grad.data_ptr() != view.data_ptr():
                view.copy_(p.grad)
            p.grad = view
        return u.grad_full

    def _start(self, u: Unit) -> list[Any]:
        return [u, start_all_reduce(self.comm, self._gradient_in_buffer(u), self.how, self._pool), None]

    def _keep(self, u: Unit, reduced: torch.Tensor) -> torch.Tensor:
        return reduced  # the whole summed gradient, in place in the buffer

    def _spread(self, u: Unit, master: torch.Tensor) -> Pending | None:
        if master is not u.full:  # mixed precision: the fp32 master rounded into the parameters
            u.full.copy_(master)
        return None


class Stage1(Stage0, stage=1):
    """+ Adam's state sharded: reduce-scatter the gradient, step on this rank's shard, all-gather the parameters."""

    def _place(self, u: Unit) -> torch.Tensor:
        super()._place(u)
        return u.full[u.lo:u.lo + u.size]

    def _start(self, u: Unit) -> list[Any]:
        return [u, start_reduce_scatter(self.comm, self._gradient_in_buffer(u), self.how, self._pool), None]

    def _keep(self, u: Unit, reduced: torch.Tensor) -> torch.Tensor:
        assert u.grad_full is not None
        return u.grad_full[u.lo:u.lo + u.size].copy_(reduced)  # the full gradient's own slice holds the sum

    def _spread(self, u: Unit, master: torch.Tensor) -> Pending | None:
        new = master.to(self.dtype)  # a copy where the dtypes differ
        if new.data_ptr() == u.full[u.lo:].data_ptr():  # fp32: the master is the parameters' own slice
            new = new.clone()
        return start_all_gather(self.comm, new, self.how, self._pool, out=u.full)


class Stage2(Stage1, stage=2):
    """+ gradients sharded: each full gradient is freed once reduce-scattered (at most IN_FLIGHT held)."""

    def _hold_gradient(self, u: Unit) -> None:
        u.grad_full = None  # autograd allocates each .grad; _start flattens and frees them

    def _make_room(self) -> None:
        in_flight = [e for e in self.in_flight if e[2] is not None]
        if len(in_flight) >= IN_FLIGHT:
            self._complete(in_flight[0])

    def _start(self, u: Unit) -> list[Any]:
        flat = u.flat([p.grad for p in u.params])
        for p in u.params:
            p.grad = None
        return [u, start_reduce_scatter(self.comm, flat, self.how, self._pool), flat]

    def _keep(self, u: Unit, reduced: torch.Tensor) -> torch.Tensor:
        return reduced
