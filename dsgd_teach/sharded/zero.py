"""ZeRO stages 0-3 with Adam, built from reduce-scatter and all-gather (Rajbhandari et al. 2020, section 5).

Every trainable parameter of the model belongs to one sharding unit (`zero_units.py`: the parameters a module owns;
norms, embeddings and tied weights included; frozen ones left whole on every rank). Rank r keeps Adam's state for
shard r of every unit (stage >= 1). Stages 0-2 communicate buckets of units (25 MiB by default, as DDP's buckets),
stage 3 one unit at a time. As soon as backward has produced a unit's gradient, a hook starts that unit's
collective without waiting, so communication overlaps the rest of backward (units start in reverse order of
registration on every rank, as DDP's buckets do): stage 0 allreduces the gradient, stages 1-3 reduce-scatter it
(stage 1 keeps the full gradient until the step, stages 2-3 free it once reduced). step() waits for the
collectives, takes one Adam step over this rank's shards and all-gathers the new parameters (stages 1-2) with every
unit's gather in flight at once. Stage 3 keeps only a shard of the parameters: a unit is all-gathered before its
module's forward and again before its backward, and freed after each; every rank must run the same modules in the
same order (as FSDP asks), since each gather is a collective.

In fp32 the parameters are Adam's master copy (stage 3: the shard is); in bf16/fp16 an fp32 master copy of the
shard is kept apart, as Rajbhandari et al. count it (K = 12).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist

from ..runtime.comm import Comm
from .loss_scaler import LossScaler
from .shard_ops import HOW, Pending, start_all_gather, start_all_reduce, start_reduce_scatter
from .zero_formulas import activation_meter, traffic_formula, zero_formula
from .zero_units import Unit, bucket_units, find_units, output_tensors, shard_parameters

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
UNUSED = ("error", "zero")
#: Stages 0-2 reduce the gradients of this many bytes of parameters at a time (PyTorch DDP's default cap).
BUCKET_BYTES = 25 * 2**20
#: Stages 2-3 wait for the oldest reduce-scatter before starting one more than this: the full gradients they hold.
IN_FLIGHT = 1
__all__ = ["DTYPES", "LossScaler", "ZeroAdam", "activation_meter", "traffic_formula", "zero_formula"]


class ZeroAdam:
    """Adam over every trainable parameter of a model, sharded by ZeRO stage 0-3; call step() after backward."""

    def __init__(self, model: torch.nn.Module, comm: Comm, stage: int = 1, how: str = "ring", precision: str = "fp32",
                 lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 scaler: LossScaler | None = None, unused: str = "error", bucket_bytes: int = BUCKET_BYTES) -> None:
        for name, value, allowed in (("stage", stage, (0, 1, 2, 3)), ("how", how, HOW),
                                     ("precision", precision, tuple(DTYPES)), ("unused", unused, UNUSED)):
            if value not in allowed:
                raise ValueError(f"ZeroAdam: {name} must be one of {allowed}, got {value!r}")
        self.model, self.comm, self.stage, self.how, self.unused = model, comm, stage, how, unused
        self.precision, self.dtype = precision, DTYPES[precision]
        self.scaler = scaler if scaler is not None else (LossScaler() if precision == "fp16" else None)
        model.to(self.dtype)
        self.units = find_units(model, comm.world, comm.rank)
        if stage <= 2:  # communicated a bucket of layers at a time, as DDP's buckets; stage 3 gathers a layer at a time
            self.units = bucket_units(self.units, bucket_bytes, comm.world, comm.rank)
        if not self.units:
            raise ValueError("ZeroAdam: the model has no trainable parameters (all have requires_grad=False)")
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="dsgd-zero-ring") if how == "ring" else None
        self.masters = [self._place(u) for u in self.units]
        self.opt = torch.optim.Adam(self.masters, lr=lr, betas=betas, eps=eps, foreach=False)
        self.order = self.units[::-1]  # the order units start their collectives in, on every rank
        self._next = 0
        self._fired: set[int] = set()  # ids of the parameters whose gradient backward produced since the last step
        self._pending: list[list[Any]] = []  # [unit, Pending, the full gradient it reads (stages 2-3) or None]
        self.events: list[dict[str, Any]] = []
        self.peak = 0
        self.grad_norm = 0.0
        for u in self.units:
            for p in u.params:
                p.register_post_accumulate_grad_hook(lambda p, u=u: self._grad_ready(u, p))
            if stage == 3:
                for m in u.modules:
                    m.register_forward_pre_hook(lambda m, a, u=u: self._gather(u))
                    m.register_forward_hook(lambda m, a, out, u=u: self._after_forward(u, out))

    def _place(self, u: Unit) -> torch.Tensor:
        """Lay the unit's parameters (and stages 0-1's gradients) in flat buffers; return its Adam master."""
        flat = u.flat([p.detach() for p in u.params])
        if self.stage == 3:
            shard_parameters(self.model, u, self.comm.world)
            u.shard = flat[u.lo:u.lo + u.size].clone()
            u.full = torch.empty(u.padded, dtype=self.dtype, device=self.comm.device)
            master = u.shard
        else:
            u.full = flat
            master = u.full if self.stage == 0 else u.full[u.lo:u.lo + u.size]
        for p, view in zip(u.params, u.views(u.full), strict=True):
            p.data = view
        if self.stage == 3:
            self._free(u)
        if self.stage <= 1:
            u.grad_full = torch.zeros_like(u.full)
            for p, view in zip(u.params, u.views(u.grad_full), strict=True):
                p.grad = view
        return master if self.dtype == torch.float32 else master.detach().float()  # mixed: a master copy apart

    # --- stage 3: parameters all-gathered just in time, freed after use -----------------------------------
    def _gather(self, u: Unit) -> None:
        if not u.gathered():
            u.full.untyped_storage().resize_(u.padded * u.full.element_size())
            pending = start_all_gather(self.comm, u.shard, self.how, self._pool, out=u.full)
            pending.wait()
            self.events.append({"unit": self.units.index(u), "what": "all-gather (just in time)",
                                "launch_s": pending.launch_s, "done_s": pending.done_s})
            self.sample()

    def _free(self, u: Unit) -> None:
        u.full.untyped_storage().resize_(0)

    def _after_forward(self, u: Unit, out: Any) -> None:
        self._free(u)
        for t in output_tensors(out):
            if t.requires_grad:
                t.register_hook(lambda g, u=u: self._gather(u))

    # --- every stage: a unit's collective started as soon as backward has produced its gradient ----------
    def _grad_ready(self, u: Unit, p: torch.Tensor) -> None:
        if id(p) in self._fired:
            raise ValueError("ZeroAdam: backward ran twice before step(); call step() after every backward "
                             "(gradient accumulation is not supported)")
        self._fired.add(id(p))
        u.waiting -= 1
        while self._next < len(self.order) and self.order[self._next].waiting == 0:
            self._launch(self.order[self._next])

    def _launch(self, v: Unit) -> None:
        """Start unit v's gradient collective (a missing gradient counts as zeros)."""
        self._next += 1
        in_flight = [e for e in self._pending if e[2] is not None]
        if self.stage >= 2 and len(in_flight) >= IN_FLIGHT:  # stages 2-3 bound the full gradients in flight
            self._complete(in_flight[0])
        self.sample()
        if self.stage <= 1:
            assert v.grad_full is not None
            for p, view in zip(v.params, v.views(v.grad_full), strict=True):
                if p.grad is None:
                    view.zero_()
                elif p.grad.data_ptr() != view.data_ptr():  # set to None or replaced: copy it in
                    view.copy_(p.grad)
                p.grad = view
            start = start_all_reduce if self.stage == 0 else start_reduce_scatter
            self._pending.append([v, start(self.comm, v.grad_full, self.how, self._pool), None])
            return
        flat = v.flat([p.grad for p in v.params])
        for p in v.params:
            p.grad = None
        if self.stage == 3:
            self._free(v)
        self._pending.append([v, start_reduce_scatter(self.comm, flat, self.how, self._pool), flat])

    def _complete(self, entry: list[Any]) -> None:
        """Wait for a unit's gradient collective, keep this rank's part of the sum, and free the full gradient."""
        u, pending = entry[0], entry[1]
        if u.grad_shard is not None:
            return
        out = pending.wait()
        entry[2] = None
        if self.stage == 0:
            u.grad_shard = out  # the whole summed gradient, in place in grad_full
        elif self.stage == 1:
            assert u.grad_full is not None
            u.grad_shard = u.grad_full[u.lo:u.lo + u.size].copy_(out)  # the full gradient's own slice holds the sum
        else:
            u.grad_shard = out
        self.events.append({"unit": self.units.index(u), "what": pending.what, "launch_s": pending.launch_s,
                            "done_s": pending.done_s})

    def _missing(self) -> list[str]:
        """Names of the parameters whose gradient backward did not produce since the last step."""
        return [n for u in self.order[self._next:] for n, p in zip(u.names, u.params, strict=True)
                if id(p) not in self._fired]

    def sample(self) -> dict[str, int]:
        """Bytes of the parameters, gradients and optimizer state this rank holds right now; updates the peak."""
        params = grads = 0
        for u in self.units:
            params += u.full.untyped_storage().nbytes() + (u.shard.numel() * u.shard.element_size())
            if u.grad_full is not None:
                grads += u.grad_full.numel() * u.grad_full.element_size()
            else:
                grads += sum(p.grad.numel() * p.grad.element_size() for p in u.params if p.grad is not None)
                if u.grad_shard is not None:
                    grads += u.grad_shard.numel() * u.grad_shard.element_size()
        grads += sum(f.numel() * f.element_size() for _, _, f in self._pending if f is not None)
        grads += sum(p.received.numel() * p.received.element_size() for _, p, _ in self._pending
                     if p.received is not None)  # a direct reduce-scatter's receive buffer, until it is summed
        optim = 0 if self.dtype == torch.float32 else sum(m.numel() * m.element_size() for m in self.masters)
        for state in self.opt.state.values():
            optim += sum(t.numel() * t.element_size() for t in state.values() if torch.is_tensor(t) and t.dim())
        held = {"params": params, "grads": grads, "optimizer": optim, "total": params + grads + optim}
        self.peak = max(self.peak, held["total"])
        return held

    def step(self) -> bool:
        """Finish the gradients' collectives, take Adam's step on this rank's shards, and spread the new parameters.

        Returns False when fp16 loss scaling found an overflow on any rank and the step was skipped.
        """
        missing = self._missing()
        if missing and self.unused == "error":
            self._clear()
            shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
            raise ValueError(f"ZeroAdam: parameter(s) {shown} got no gradient on rank {self.comm.rank} (not used to "
                             "compute the loss); freeze them with requires_grad_(False), or pass unused='zero' to "
                             "count their gradient as zero")
        while self._next < len(self.order):
            self._launch(self.order[self._next])
        scale = self.scaler.scale if self.scaler is not None else 1.0
        if self.scaler is not None:  # every gradient first: the ranks vote on an overflow before anyone steps
            for entry in self._pending:
                self._complete(entry)
            bad = torch.tensor([float(any(not torch.isfinite(u.grad_shard).all() for u in self.units))],
                               device=self.comm.device)
            self.comm.wait_all([dist.all_reduce(bad, op=dist.ReduceOp.MAX, async_op=True)], "the overflow vote")
            self.scaler.update(bool(bad.item() > 0))
            if bad.item() > 0:
                self.last_held = self.sample()
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
        self.last_held = self.sample()  # the model states at the optimizer step
        self.grad_norm = math.sqrt(squares)  # this rank's shard of the averaged, unscaled gradient (stage 0: all)
        for u, pending in gathers:
            if pending is not None:
                pending.wait()
                self.events.append({"unit": self.units.index(u), "what": pending.what, "launch_s": pending.launch_s,
                                    "done_s": pending.done_s})
        self._clear()
        return True

    def _spread(self, u: Unit, master: torch.Tensor) -> Pending | None:
        """Put the updated master into the parameters: in place, or an all-gather started (stages 1-2)."""
        new = master if master.dtype == self.dtype else master.to(self.dtype)
        if self.stage == 3:
            if new is not u.shard:
                u.shard.copy_(new)
            return None
        if self.stage == 0:
            if new is not u.full:
                u.full.copy_(new)
            return None
        return start_all_gather(self.comm, new.clone() if new.data_ptr() == u.full[u.lo:].data_ptr() else new,
                                self.how, self._pool, out=u.full)

    def _clear(self) -> None:
        self._next, self._pending, self._fired = 0, [], set()
        for u, m in zip(self.units, self.masters, strict=True):
            u.grad_shard, u.waiting, m.grad = None, len(u.params), None
            if u.grad_full is not None:
                u.grad_full.zero_()
            else:
                for p in u.params:
                    p.grad = None

    @contextmanager
    def gathered(self) -> Iterator[None]:
        """Every parameter whole while inside (stage 3 all-gathers them: every rank must enter); freed after."""
        if self.stage == 3:
            for u in self.units:
                self._gather(u)
        try:
            yield
        finally:
            if self.stage == 3:
                for u in self.units:
                    self._free(u)

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
