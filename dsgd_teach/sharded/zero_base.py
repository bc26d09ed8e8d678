"""The machinery every ZeRO stage shares: a hook that starts a unit's collective once backward has produced its
gradient, the collectives in flight, the optimizer step's outline, and reading the model back.

The stages themselves, each a small step on the last, are in `zero.py`, where `ZeroAdam(model, comm, stage=s)`
builds stage s. Units (`zero_units.py`) start their collectives in reverse order of registration on every rank, as DDP's
buckets do, so the ranks' collectives pair up. Memory is counted apart (`zero_memory.py`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from ..runtime.ranks.comm import Comm
from .loss_scaler import LossScaler
from .shard_ops import HOW, Pending
from .zero_formulas import zero_formula
from .zero_memory import HeldMemory
from .zero_units import Unit, bucket_units, find_units

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
UNUSED = ("error", "zero")
#: Stages 0-2 reduce the gradients of this many bytes of parameters at a time (PyTorch DDP's default cap).
BUCKET_BYTES = 25 * 2**20


class ShardedAdam:
    """What every ZeRO stage shares (zero.py's ZeroAdam and its stages build on it); call step() after backward."""

    stage: ClassVar[int] = -1  # set by each stage's class
    bucketed: ClassVar[bool] = True  # stages 0-2 send buckets of units; stage 3 gathers a unit at a time

    def __init__(self, model: torch.nn.Module, comm: Comm, stage: int = 1, how: str = "ring", precision: str = "fp32",
                 lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 scaler: LossScaler | None = None, unused: str = "error", bucket_bytes: int = BUCKET_BYTES) -> None:
        for name, value, allowed in (("stage", stage, (self.stage,)), ("how", how, HOW),
                                     ("precision", precision, tuple(DTYPES)), ("unused", unused, UNUSED)):
            if value not in allowed:
                raise ValueError(f"{type(self).__name__}: {name} must be one of {allowed}, got {value!r}")
        self.model, self.comm, self.how, self.unused = model, comm, how, unused
        self.precision, self.dtype = precision, DTYPES[precision]
        self.scaler = scaler if scaler is not None else (LossScaler() if precision == "fp16" else None)
        model.to(self.dtype)
        self.units = find_units(model, comm.world, comm.rank)
        if self.bucketed:
            self.units = bucket_units(self.units, bucket_bytes, comm.world, comm.rank)
        if not self.units:
            raise ValueError("ZeroAdam: the model has no trainable parameters (all have requires_grad=False)")
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="dsgd-zero-ring") if how == "ring" else None
        owned = [self._place(u) for u in self.units]  # what this rank's Adam steps on, unit by unit
        self.masters = [t if self.dtype == torch.float32 else t.detach().float() for t in owned]  # mixed: fp32 copy
        self.opt = torch.optim.Adam(self.masters, lr=lr, betas=betas, eps=eps, foreach=False)
        self.order = self.units[::-1]  # the order units start their collectives in, on every rank
        self._next = 0
        self._fired: set[int] = set()  # ids of the parameters whose gradient backward produced since the last step
        self._pending: list[list[Any]] = []  # [unit, Pending, the full gradient it reads (stages 2-3) or None]
        self.events: list[dict[str, Any]] = []
        self.memory = HeldMemory(self.units, self.masters, self.opt, lambda: self._pending,
                                 masters_apart=self.dtype != torch.float32)
        self.grad_norm = 0.0
        for u in self.units:
            for p in u.params:
                p.register_post_accumulate_grad_hook(lambda p, u=u: self._grad_ready(u, p))

    # --- what each stage defines (zero.py) --------------------------------------------------------------
    def _place(self, u: Unit) -> torch.Tensor:
        """Lay out the unit's parameters (and gradients); return the part of them this rank's Adam steps on."""
        raise NotImplementedError

    def _start(self, u: Unit) -> list[Any]:
        """Start the unit's gradient collective: [unit, Pending, the full gradient it reads or None]."""
        raise NotImplementedError

    def _keep(self, u: Unit, reduced: torch.Tensor) -> torch.Tensor:
        """Where this rank keeps its part of the unit's summed gradient, given the collective's output."""
        raise NotImplementedError

    def _spread(self, u: Unit, master: torch.Tensor) -> Pending | None:
        """Put the updated master into the parameters: in place, or an all-gather started."""
        raise NotImplementedError

    def _make_room(self) -> None:
        """Before a collective starts: finish older ones if the stage bounds what is in flight (none by default)."""

    # --- a unit's collective starts as soon as backward has produced its gradient -----------------------
    def _grad_ready(self, u: Unit, p: torch.Tensor) -> None:
        if id(p) in self._fired:
            raise ValueError("ZeroAdam: backward ran twice before step(); call step() after every backward "
                             "(gradient accumulation is not supported)")
        self._fired.add(id(p))
        u.waiting -= 1
        while self._next < len(self.order) and self.order[self._next].waiting == 0:
            self._launch(self.order[self._next])

    def _launch(self, u: Unit) -> None:
        """Start unit u's gradient collective (a gradient backward did not produce counts as zeros)."""
        self._next += 1
        self._make_room()
        self.memory.sample()
        self._pending.append(self._start(u))

    def _complete(self, entry: list[Any]) -> None:
        """Wait for a unit's gradient collective and keep this rank's part of the sum (the full gradient is freed)."""
        u, pending = entry[0], entry[1]
        if u.grad_shard is None:
            reduced = pending.wait()
            entry[2] = None
            u.grad_shard = self._keep(u, reduced)
            self._record(u, pending)

    def _record(self, u: Unit, pending: Pending) -> None:
        self.events.append({"unit": self.units.index(u), "what": pending.what, "launch_s": pending.launch_s,
                            "done_s": pending.done_s})

    def _check_all_used(self) -> None:
        """With unused='error', a clear error naming the parameters backward gave no gradient since the last step."""
        missing = [n for u in self.order[self._next:] for n, p in zip(u.names, u.params, strict=True)
                   if id(p) not in self._fired]
        if missing and self.unused == "error":
            self._clear()
            shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
            raise ValueError(f"ZeroAdam: parameter(s) {shown} got no gradient on rank {self.comm.rank} (not used to "
                             "compute the loss); freeze them with requires_grad_(False), or pass unused='zero' to "
                             "count their gradient as zero")

    def _overflowed(self) -> bool:
        """fp16: every rank votes on whether any gradient shard overflowed, and the scaler learns the answer."""
        assert self.scaler is not None
        for entry in self._pending:
            self._complete(entry)
        bad = torch.tensor([float(any(not torch.isfinite(u.grad_shard).all() for u in self.units))],
                           device=self.comm.device)
        self.comm.wait_all([dist.all_reduce(bad, op=dist.ReduceOp.MAX, async_op=True)], "the overflow vote")
        self.scaler.update(bool(bad.item() > 0))
        return bool(bad.item() > 0)

    # --- the optimizer step: the same outline for every stage --------------------------------------------
    def step(self) -> bool:
        """Finish the gradients' collectives, take Adam's step on this rank's part, and spread the new parameters.

        Returns False when fp16 loss scaling found an overflow on any rank and the step was skipped.
        """
        self._check_all_used()
        while self._next < len(self.order):  # units backward did not reach (unused='zero'): zero gradients
            self._launch(self.order[self._next])
        scale = self.scaler.scale if self.scaler is not None else 1.0
        if self.scaler is not None and self._overflowed():
            self.memory.sample_step()
            self._clear()
            return False
        squares = 0.0
        for entry in self._pending:
            u = entry[0]
            self._complete(entry)
            g = u.grad_shard.float().div_(self.comm.world * scale)  # the unit's summed gradient (or shard), averaged
            squares += float(torch.linalg.vector_norm(g)) ** 2
            self.masters[self.units.index(u)].grad = g
        self.opt.step()
        gathers = [(u, self._spread(u, m)) for u, m in zip(self.units, self.masters, strict=True)]
        self.memory.sample_step()  # the model states at the optimizer step
        self.grad_norm = math.sqrt(squares)  # this rank's part of the averaged, unscaled gradient (stage 0: all)
        for u, pending in gathers:
            if pending is not None:
                pending.wait()
                self._record(u, pending)
        self._clear()
        return True

    def _clear(self) -> None:
        self._next, self._pending, self._fired = 0, [], set()
        for u, m in zip(self.units, self.masters, strict=True):
            u.grad_shard, u.waiting, m.grad = None, len(u.params), None
            if u.grad_full is not None:
                u.grad_full.zero_()
            else:
                for p in u.params:
                    p.grad = None

    # --- reading the model -----------------------------------------------------------------------------
    @contextmanager
    def gathered(self) -> Iterator[None]:
        """Every parameter whole while inside (stage 3 all-gathers them: every rank must enter)."""
        yield

    def full_params(self) -> torch.Tensor:
        """Every parameter of the model (frozen ones too), in model.parameters() order, as one fp32 vector."""
        with self.gathered():
            return torch.cat([p.detach().float().reshape(-1) for p in self.model.parameters()])

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The model's full state dict, copied (stage 3 gathers it: every rank must call)."""
        with self.gathered():
            return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def take_events(self) -> list[dict[str, Any]]:
        """The collectives since the last call: unit, what, launch_s and done_s on time.perf_counter's clock."""
        out, self.events = self.events, []
        return out

    def formula(self, mixed: bool | None = None) -> dict[str, float]:
        """Rajbhandari et al.'s bytes per rank for this stage (Ψ = padded parameter count); mixed defaults to the
        optimizer's own precision (bf16/fp16: 2Ψ + 2Ψ + 12Ψ; fp32: 4Ψ + 4Ψ + 8Ψ)."""
        mixed = self.dtype != torch.float32 if mixed is None else mixed
        return zero_formula(sum(u.padded for u in self.units), self.comm.world, self.stage, mixed=mixed)

    def close(self) -> None:
        """Stop the communication thread (ring only)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
