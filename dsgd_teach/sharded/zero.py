"""ZeRO stages 0-3 with Adam, built from reduce-scatter and all-gather (Rajbhandari et al. 2020, section 5).

The model's Linear layers are the sharding units (FSDP's units, Zhao et al. 2023). Each unit's parameters, laid
end to end and padded to a multiple of N, are cut into N equal shards; rank r owns shard r of every unit, and keeps
the fp32 master copy and Adam's two moments of its shards only (stage >= 1). Stage 0 is plain data parallelism
with a replicated optimizer. Stage 1 reduce-scatters the full gradients after backward; stage 2 reduce-scatters
each unit's gradient as soon as backward has produced it and frees the full gradient; stage 3 also keeps only a
shard of the parameters, all-gathers a unit just before its forward and again before its backward, and frees it
after each. After Adam, stages 0-2 all-gather the updated parameters.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from ..runtime.comm import Comm
from .shard_ops import all_gather, padded_numel, reduce_scatter

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


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


class Unit:
    """One sharding unit (a Linear layer): its parameters, padded flat size, and this rank's shards."""

    def __init__(self, module: torch.nn.Module, world: int, rank: int) -> None:
        self.module, self.params = module, list(module.parameters())
        self.numel = sum(p.numel() for p in self.params)
        self.padded = padded_numel(self.numel, world)
        self.size = self.padded // world
        self.lo = rank * self.size
        self.grad_shard: torch.Tensor | None = None
        self.waiting = len(self.params)

    def flat(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        """tensors (one per parameter) laid end to end and zero-padded to the unit's padded size."""
        flat = torch.cat([t.reshape(-1) for t in tensors])
        return torch.nn.functional.pad(flat, (0, self.padded - self.numel))

    def write(self, full: torch.Tensor) -> None:
        """Copy a padded flat vector into the unit's parameters."""
        offset = 0
        with torch.no_grad():
            for p in self.params:
                p.copy_(full[offset:offset + p.numel()].view_as(p))
                offset += p.numel()


class ZeroAdam:
    """Adam over a model's Linear units, sharded by ZeRO stage 0-3; call step() after backward."""

    def __init__(self, model: torch.nn.Module, comm: Comm, stage: int = 1, how: str = "ring", precision: str = "fp32",
                 lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 scaler: LossScaler | None = None) -> None:
        self.comm, self.stage, self.how = comm, stage, how
        self.dtype = DTYPES[precision]
        self.scaler = scaler if scaler is not None else (LossScaler() if precision == "fp16" else None)
        model.to(self.dtype)
        self.units = [Unit(m, comm.world, comm.rank) for m in model.modules() if isinstance(m, torch.nn.Linear)]
        self.masters = []
        for u in self.units:
            full = u.flat([p.detach() for p in u.params]).float()
            self.masters.append(full.clone() if stage == 0 else full[u.lo:u.lo + u.size].clone())
        self.opt = torch.optim.Adam(self.masters, lr=lr, betas=betas, eps=eps, foreach=False)
        self.peak = 0
        self.activation_bytes = 0
        if stage >= 2:
            for u in self.units:
                for p in u.params:
                    p.register_post_accumulate_grad_hook(lambda p, u=u: self._grad_ready(u))
        if stage == 3:
            for u in self.units:
                u.shard = u.flat([p.detach() for p in u.params])[u.lo:u.lo + u.size].clone()
                u.full = torch.empty(u.padded, dtype=self.dtype, device=comm.device)
                offset = 0
                for p in u.params:
                    p.data = u.full[offset:offset + p.numel()].view_as(p)
                    offset += p.numel()
                self._free(u)
                u.module.register_forward_pre_hook(lambda m, a, u=u: self._gather(u))
                u.module.register_forward_hook(lambda m, a, out, u=u: self._after_forward(u, out))

    # --- stage 3: parameters all-gathered just in time, freed after use -----------------------------------
    def _gather(self, u: Unit) -> None:
        storage = u.full.untyped_storage()
        if storage.size() == 0:
            storage.resize_(u.padded * u.full.element_size())
            u.full.copy_(all_gather(self.comm, u.shard, self.how))
            self.sample()

    def _free(self, u: Unit) -> None:
        u.full.untyped_storage().resize_(0)

    def _after_forward(self, u: Unit, out: torch.Tensor) -> None:
        self._free(u)
        if out.requires_grad:
            out.register_hook(lambda g, u=u: self._gather(u))

    # --- stage >= 2: a unit's gradient reduce-scattered as soon as backward has produced it --------------
    def _grad_ready(self, u: Unit) -> None:
        u.waiting -= 1
        if u.waiting == 0:
            self.sample()
            u.grad_shard = reduce_scatter(self.comm, u.flat([p.grad for p in u.params]), self.how)
            for p in u.params:
                p.grad = None
            if self.stage == 3:
                self._free(u)
            u.waiting = len(u.params)

    def sample(self) -> dict[str, int]:
        """Bytes of the parameters, gradients and optimizer state this rank holds right now; updates the peak."""
        params = grads = 0
        for u in self.units:
            if self.stage == 3:
                params += u.shard.numel() * u.shard.element_size() + u.full.untyped_storage().nbytes()
            else:
                params += sum(p.numel() * p.element_size() for p in u.params)
            grads += sum(p.grad.numel() * p.grad.element_size() for p in u.params if p.grad is not None)
            if u.grad_shard is not None:
                grads += u.grad_shard.numel() * u.grad_shard.element_size()
        optim = sum(m.numel() * m.element_size() for m in self.masters)
        for state in self.opt.state.values():
            optim += sum(t.numel() * t.element_size() for t in state.values() if torch.is_tensor(t) and t.dim())
        held = {"params": params, "grads": grads, "optimizer": optim, "total": params + grads + optim}
        self.peak = max(self.peak, held["total"])
        return held

    def step(self) -> bool:
        """Reduce the gradients, take Adam's step on this rank's shards, and spread the new parameters.

        Returns False when fp16 loss scaling found an overflow on any rank and the step was skipped.
        """
        held = self.sample()  # the model states at the step; stage <= 1's reduced shard is a temporary buffer
        for u in self.units:
            if self.stage <= 1:
                u.grad_shard = reduce_scatter(self.comm, u.flat([p.grad for p in u.params]), self.how)
                self.sample()
        scale = self.scaler.scale if self.scaler is not None else 1.0
        grads = []
        for u in self.units:
            g = u.grad_shard.float() / (self.comm.world * scale)
            grads.append(all_gather(self.comm, g, self.how) if self.stage == 0 else g)
        self.grad_norm = float(torch.sqrt(sum((g.double() ** 2).sum() for g in grads)))  # this rank's shard, unscaled
        if self.scaler is not None:
            bad = torch.tensor([float(any(not torch.isfinite(g).all() for g in grads))], device=self.comm.device)
            self.comm.wait_all([dist.all_reduce(bad, op=dist.ReduceOp.MAX, async_op=True)], "the overflow vote")
            self.scaler.update(bool(bad.item() > 0))
            if bad.item() > 0:
                self._clear()
                self.last_held = held
                return False
        for m, g in zip(self.masters, grads, strict=True):
            m.grad = g
        self.opt.step()
        for u, m in zip(self.units, self.masters, strict=True):
            if self.stage == 3:
                u.shard.copy_(m.to(self.dtype))
            elif self.stage == 0:
                u.write(m.to(self.dtype))
            else:
                u.write(all_gather(self.comm, m.to(self.dtype), self.how))
        self._clear()
        self.last_held = held
        return True

    def _clear(self) -> None:
        for u, m in zip(self.units, self.masters, strict=True):
            u.grad_shard = None
            m.grad = None
            for p in u.params:
                p.grad = None

    def full_params(self) -> torch.Tensor:
        """All parameters as one fp32 vector (stage 3 gathers them; used to compare with the oracles)."""
        parts = []
        for u in self.units:
            if self.stage == 3:
                parts.append(all_gather(self.comm, u.shard, self.how)[:u.numel].float())
            else:
                parts.append(u.flat([p.detach() for p in u.params])[:u.numel].float())
        return torch.cat(parts)

    def formula(self, mixed: bool = True) -> dict[str, float]:
        """Rajbhandari et al.'s bytes per rank for this stage (Psi = padded parameter count, K = 12)."""
        return zero_formula(sum(u.padded for u in self.units), self.comm.world, self.stage)


def zero_formula(psi: float, n: int, stage: int, k: float = 12.0) -> dict[str, float]:
    """Mixed-precision Adam bytes per rank: 2Psi params, 2Psi grads, K Psi optimizer, each divided by N once sharded."""
    params = 2 * psi / (n if stage >= 3 else 1)
    grads = 2 * psi / (n if stage >= 2 else 1)
    optim = k * psi / (n if stage >= 1 else 1)
    return {"params": params, "grads": grads, "optimizer": optim, "total": params + grads + optim}


def traffic_formula(psi: float, n: int, stage: int) -> float:
    """Elements each rank sends per step: 2Psi(N-1)/N for stages 0-2, 3Psi(N-1)/N for stage 3 (ring collectives)."""
    return (3 if stage == 3 else 2) * psi * (n - 1) / n


def activation_meter(model: torch.nn.Module | None = None) -> tuple[Any, list[int]]:
    """A saved_tensors_hooks context that adds up the bytes autograd saves for backward, activations only.

    Parameters are model state, not activations: a saved tensor is skipped when it is a Parameter or shares its
    storage with one of model's parameters (a Linear saves its weight transposed, a view of the same bytes).
    """
    total = [0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        if isinstance(t, torch.nn.Parameter):
            return t
        if model is not None:
            ptr = t.untyped_storage().data_ptr()  # read now: ZeRO-3 re-allocates a unit's storage when it gathers
            if any(p.untyped_storage().data_ptr() == ptr for p in model.parameters()):
                return t
        total[0] += t.numel() * t.element_size()
        return t

    return torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), total
