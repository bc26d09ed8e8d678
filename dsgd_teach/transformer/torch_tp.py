"""PyTorch's own tensor and sequence parallelism of the same GPT: the reference that tensor_parallel.py must equal.

`torch.distributed.tensor.parallel.parallelize_module` with a plan per block: `ColwiseParallel` on attn.qkv and
mlp.fc, `RowwiseParallel` on attn.proj and mlp.proj; with sequence parallelism, `SequenceParallel` on ln1 and ln2,
the column-split linears taking a sequence-sharded input (`input_layouts=Shard(1)`: all-gathered) and the row-split
ones giving one (`output_layouts=Shard(1)`: reduce-scattered), as PyTorch's tensor-parallel tutorial plans Llama's
blocks. The weights are the oracle's, `build_gpt(shape, seed)`, cut by DTensor into the same contiguous slices.
Embeddings, final norm and head stay plain modules, run on this rank's chunk under sequence parallelism and their
gradients summed over the group, exactly as tensor_parallel.tp_rank does.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from .corpus import batch_at, make_corpus
from .model import GPT, build_gpt, lm_loss
from .sequence_parallel import sequence_chunk
from .tensor_parallel import TPConfig


def torch_plan(layers: int, sequence_parallel: bool) -> dict[str, Any]:
    """parallelize_module's plan for the GPT's blocks: Megatron's splits in PyTorch's styles."""
    plan: dict[str, Any] = {}
    for i in range(layers):
        p = f"blocks.{i}."
        if sequence_parallel:
            plan |= {p + "ln1": SequenceParallel(), p + "attn.qkv": ColwiseParallel(input_layouts=Shard(1)),
                     p + "attn.proj": RowwiseParallel(output_layouts=Shard(1)),
                     p + "ln2": SequenceParallel(), p + "mlp.fc": ColwiseParallel(input_layouts=Shard(1)),
                     p + "mlp.proj": RowwiseParallel(output_layouts=Shard(1))}
        else:
            plan |= {p + "attn.qkv": ColwiseParallel(), p + "attn.proj": RowwiseParallel(),
                     p + "mlp.fc": ColwiseParallel(), p + "mlp.proj": RowwiseParallel()}
    return plan


def torch_parallel_gpt(config: TPConfig, mesh: DeviceMesh) -> GPT:
    """The oracle's GPT with its blocks parallelized by PyTorch over `mesh` (a 1-d mesh of the tensor group)."""
    return parallelize_module(build_gpt(config.shape, config.seed), mesh,
                              torch_plan(config.shape.layers, config.sequence_parallel))


def local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's values as this rank holds them (Shard: its slice; Replicate or Partial: the whole, summed)."""
    if isinstance(t, DTensor):
        return t.to_local() if any(isinstance(p, Shard) for p in t.placements) else t.full_tensor()
    return t


def torch_tp_rank(config: TPConfig, mesh: DeviceMesh, keep_grads: bool = True) -> dict[str, Any]:
    """tensor_parallel.tp_rank's loop on PyTorch's parallelized GPT: its losses, gradients (local) and step times."""
    torch.set_num_threads(config.threads)
    sp, s = config.sequence_parallel, config.shape.seq_len
    rank, size = mesh.get_local_rank(), mesh.size()
    model = torch_parallel_gpt(config, mesh)
    plain = [p for p in model.parameters() if not isinstance(p, DTensor)]  # embeddings, ln_f, head
    corpus = make_corpus(config.seed, config.corpus_tokens, config.shape.vocab)
    tokens = sequence_chunk(rank, size, s) if sp else slice(0, s)
    positions = torch.arange(s)[tokens]
    out: dict[str, Any] = {"loss": [], "grads": [], "step_s": []}
    for step in range(config.steps):
        inputs, targets = batch_at(corpus, step, None, config.batch, s, config.seed)
        inputs, targets = inputs[:, tokens], targets[:, tokens]
        t0 = time.perf_counter()
        model.zero_grad(set_to_none=False)
        loss = lm_loss(model(inputs, positions=positions), targets)
        share = loss / size if sp else loss
        share.backward()
        if sp:
            sum_plain_grads(plain, mesh)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(p.grad, alpha=-config.lr)
        out["step_s"].append(time.perf_counter() - t0)
        out["loss"].append(float(share.detach()))
        if keep_grads:
            out["grads"].append({n: local(p.grad).detach().clone() for n, p in model.named_parameters()})
    out["params"] = {n: local(p).detach().clone() for n, p in model.named_parameters()}
    return out


def sum_plain_grads(params: list[nn.Parameter], mesh: DeviceMesh) -> None:
    """Sum the plain (not DTensor) parameters' gradients over the mesh's group: one library allreduce."""
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    dist.all_reduce(flat, group=mesh.get_group())
    offset = 0
    for p in params:
        p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
        offset += p.numel()
