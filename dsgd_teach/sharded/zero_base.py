"""ZeroAdam: what every ZeRO stage shares, above all the optimizer step's outline; ZeroAdam(model, comm, stage=s)
builds stage s, each stage a small step on the last (`zero.py`: stages 0-2; `zero_stage3.py`).

Each unit's gradient collective starts mid-backward (`zero_launch.py`); what a rank holds is counted by a watcher
told of each moment (`zero_memory.py`); the model is read back through `zero_readback.py`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

import torch

from ..runtime.ranks.comm import Comm
from .loss_scaler import LossScaler, overflow_on_any_rank
from .shard_ops import HOW, Pending
from .zero_launch import GradientLaunches
from .zero_readback import ReadBack
from .zero_units import Unit, bucket_units, find_units, refuse_missing

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
STAGES, UNUSED = (0, 1, 2, 3), ("error", "zero")
#: Stages 0-2 reduce the gradients of this many bytes of parameters at a time (PyTorch DDP's default cap).
BUCKET_BYTES = 25 * 2**20


class ZeroAdam(GradientLaunches, ReadBack):
    """Adam over every trainable parameter of a model, sharded by ZeRO stage 0-3; call step() after backward.

    ZeroAdam(model, comm, stage=s, ...) builds stage s's class (Stage0 ... Stage3), which defines the methods below
    marked "each stage"."""

    stage: ClassVar[int] = -1  # set by each stage's class
    bucketed: ClassVar[bool] = True  # stages 0-2 send buckets of units; stage 3 gathers a unit at a time
    _by_stage: ClassVar[dict[int, type[ZeroAdam]]] = {}

    def __init_subclass__(cls, stage: int, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.stage = stage
        ZeroAdam._by_stage[stage] = cls

    def __new__(cls, model: torch.nn.Module, comm: Comm, stage: int = 1, *args: Any, **kwargs: Any) -> ZeroAdam:
        if cls is ZeroAdam:
            if stage not in STAGES:
                raise ValueError(f"ZeroAdam: stage must be one of {STAGES}, got {stage!r}")
            cls = ZeroAdam._by_stage[stage]
        return super().__new__(cls)

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
        self.in_flight: list[list[Any]] = []  # [unit, Pending, the full gradient it reads (stages 2-3) or None]
        self.events: list[dict[str, Any]] = []
        self.watchers: list[Callable[[str], None]] = []  # told of each moment: "collective", "gathered", "step"
        self.grad_norm = 0.0
        self._hook_gradients()  # each unit's collective starts once backward has produced its gradients

    # --- each stage (zero.py, zero_stage3.py) defines these, and _start, _keep, _make_room (zero_launch.py) ------
    def _place(self, u: Unit) -> torch.Tensor:
        """Lay out the unit's parameters (and gradients); return the part of them this rank's Adam steps on."""
        raise NotImplementedError

    def _spread(self, u: Unit, master: torch.Tensor) -> Pending | None:
        """Put the updated master into the parameters: in place, or an all-gather started."""
        raise NotImplementedError

    # --- the optimizer step: the same outline for every stage ------------------------------------------------
    def step(self) -> bool:
        """Finish the gradients' collectives, take Adam's step on this rank's part, and spread the new parameters.

        Returns False when fp16 loss scaling found an overflow on any rank and the step was skipped.
        """
        if self.unused == "error":
            refuse_missing(self.order[self._next:], self._fired, self.comm.rank, on_refusal=self._clear)
        while self._next < len(self.order):  # units backward did not reach (unused='zero'): zero gradients
            self._launch(self.order[self._next])
        for entry in self.in_flight:
            self._complete(entry)
        scale = self.scaler.scale if self.scaler is not None else 1.0
        if self.scaler is not None and not self.scaler.step_ok(overflow_on_any_rank(self.comm, self.units)):
            self._tell("step")
            self._clear()
            return False
        squares = 0.0
        for u, master in zip(self.units, self.masters, strict=True):
            g = u.grad_shard.float().div_(self.comm.world * scale)  # the unit's summed gradient (or shard), averaged
            squares += float(torch.linalg.vector_norm(g)) ** 2
            master.grad = g
        self.opt.step()
        gathers = [(u, self._spread(u, m)) for u, m in zip(self.units, self.masters, strict=True)]
        self._tell("step")  # the model states at the optimizer step
        self.grad_norm = math.sqrt(squares)  # this rank's part of the averaged, unscaled gradient (stage 0: all)
        for u, pending in gathers:
            if pending is not None:
                pending.wait()
                self._record(u, pending)
        self._clear()
        return True

    def _clear(self) -> None:
        self._next, self.in_flight, self._fired = 0, [], set()
        for u, m in zip(self.units, self.masters, strict=True):
            u.grad_shard, u.waiting, m.grad = None, len(u.params), None
            if u.grad_full is not None:
                u.grad_full.zero_()
            else:
                for p in u.params:
                    p.grad = None
