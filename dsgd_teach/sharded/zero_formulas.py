"""ZeRO's formulas and meters: model-state bytes per rank by stage, elements sent per step, activations saved.

Rajbhandari et al. 2020, section 3.1 and figure 1: mixed-precision Adam keeps 2Ψ bytes of fp16/bf16 parameters,
2Ψ of gradients and KΨ of optimizer state (K = 12: an fp32 master copy and two fp32 moments); stage 1 divides
the optimizer state by N, stage 2 the gradients too, stage 3 the parameters too. Plain fp32 Adam keeps 4Ψ of
parameters, 4Ψ of gradients and 8Ψ of moments, with no separate master copy: the parameters are the master.
"""

from __future__ import annotations

from typing import Any

import torch


def zero_formula(psi: float, n: int, stage: int, k: float = 12.0, mixed: bool = True) -> dict[str, float]:
    """Adam's bytes per rank: mixed precision 2Ψ params, 2Ψ grads, KΨ optimizer; fp32 (mixed=False) 4Ψ, 4Ψ, 8Ψ;
    each divided by N once its stage shards it."""
    weight, state = (2.0, k) if mixed else (4.0, k - 4.0)  # fp32: the parameters are the master copy
    params = weight * psi / (n if stage >= 3 else 1)
    grads = weight * psi / (n if stage >= 2 else 1)
    optim = state * psi / (n if stage >= 1 else 1)
    return {"params": params, "grads": grads, "optimizer": optim, "total": params + grads + optim}


def traffic_formula(psi: float, n: int, stage: int) -> float:
    """Elements each rank sends per step: 2Psi(N-1)/N for stages 0-2, 3Psi(N-1)/N for stage 3 (ring collectives).

    Stage 3's count assumes every unit's modules run once per forward; each extra call (a module used twice, a tied
    unit's second module) adds one all-gather of that unit.
    """
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
