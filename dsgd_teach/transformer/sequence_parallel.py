"""Sequence parallelism (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
section 4.2.2, figure 5): the layer-norm (and dropout) regions run on s/N_tp of the tokens on each tensor-parallel
rank.

Tensor parallelism alone leaves the layer norms, residual adds and dropouts replicated: every rank holds the whole
[B, s, h] activation there. Sequence parallelism cuts that region along the sequence, and Megatron's two operators
change with it: where tensor parallelism had f (identity forward, allreduce backward) in front of the column-split
linear, sequence parallelism has g, an all-gather along the sequence forward and a reduce-scatter backward; where it
had g (allreduce forward) after the row-split linear, it has ḡ, a reduce-scatter forward and an all-gather backward.
A ring allreduce is a reduce-scatter followed by an all-gather, so the bytes are the same; the activations held in
the norm regions shrink N_tp times (Korthikanti et al., section 4.2.2 and Table 2).

Here the embeddings, the final norm and the LM head run on the chunk too, so every parameter that is not split
(norms, the row-split linears' biases, embeddings, head) sees only its rank's tokens; their gradients are summed over
the tensor group once per step (`sum_replicated_grads`), as Megatron-LM sums its sequence-parallel norms' gradients.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .tensor_group import TensorGroup


class GatherSequence(torch.autograd.Function):
    """Korthikanti et al.'s g: all-gather along the sequence forward ([B, s/N_tp, h] -> [B, s, h]), reduce-scatter
    backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: TensorGroup) -> torch.Tensor:
        ctx.group = group
        return group.all_gather_sequence(x, "g forward")

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return ctx.group.reduce_scatter_sequence(grad, "g backward"), None


class ScatterSequence(torch.autograd.Function):
    """Korthikanti et al.'s ḡ: reduce-scatter along the sequence forward ([B, s, h] partial sums -> [B, s/N_tp, h]),
    all-gather backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: TensorGroup) -> torch.Tensor:
        ctx.group = group
        return group.reduce_scatter_sequence(x, "g-bar forward")

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return ctx.group.all_gather_sequence(grad, "g-bar backward"), None


def sequence_chunk(rank: int, size: int, seq_len: int) -> slice:
    """The positions rank `rank` of N_tp = `size` holds under sequence parallelism: a contiguous s/N_tp of them."""
    if seq_len % size:
        raise ValueError(f"seq_len must be a multiple of N_tp={size} for sequence parallelism, got {seq_len}")
    per = seq_len // size
    return slice(rank * per, (rank + 1) * per)


def sum_replicated_grads(params: list[nn.Parameter], group: TensorGroup) -> None:
    """Sum the gradients of the parameters every rank holds whole (each saw only its tokens): one allreduce."""
    if group.size == 1 or not params:
        return
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    summed = group.all_reduce(flat, "replicated grads")
    offset = 0
    for p in params:
        p.grad.copy_(summed[offset:offset + p.numel()].view_as(p))
        offset += p.numel()
