"""Tensor parallelism of the GPT (Shoeybi et al. 2019, "Megatron-LM", section 3), with or without sequence
parallelism (Korthikanti et al. 2022, section 4.2.2; sequence_parallel.py), on chapter 05's collectives.

Each block's two matrix pairs are split over the N_tp ranks of a tensor group, so that a block needs one collective
forward and one backward per pair:
- attention: `qkv` (h -> 3h) is split by output columns, a/N_tp whole heads per rank (model.py lays the columns out
  head by head); each rank attends with its own heads; `proj` (h -> h) is split by input rows, so each rank's
  output is a partial sum of the whole [B, s, h];
- MLP: `fc` (h -> mlp_ratio·h) split by columns, GELU on each rank's columns, `proj` split by rows: a partial sum.
The conjugate operators: f in front of a column-split linear (identity forward, allreduce of the input's gradient
backward) and g after a row-split one (allreduce forward, identity backward). Per layer: 2 allreduces of B·s·h
elements forward and 2 backward (Shoeybi et al., figures 3 and 4); a ring sends 2(N_tp - 1)/N_tp of each per
rank. With sequence parallelism f becomes an all-gather (backward: reduce-scatter) and g a reduce-scatter (backward:
all-gather), along the sequence: the same bytes, and the norms hold s/N_tp tokens per rank.

The interface the mesh (composed.py) and the tests use, on any process group:
    group = TensorGroup(comm, how="ring" | "library", group=torch_group)   # comm: ranks = positions in the group
    block = shard_block_for_tp(full_block, group, sequence_parallel)      # this rank's slice of one Block
    model = shard_gpt(build_gpt(shape, seed), group, sequence_parallel)   # the whole GPT, sliced
    shard_of(name, full_tensor, rank, size)                               # the oracle's tensor -> this rank's slice
    replicated_parameters(model)                                          # what every rank holds whole
    group.records                                                         # each collective: op, K, bytes sent
With sequence parallelism a rank feeds the model only its tokens, `sequence_chunk(rank, N_tp, s)` of the inputs,
targets and positions (`model(inputs, positions=positions)`), takes lm_loss / N_tp as its share of the loss, and
after backward calls `sum_replicated_grads(replicated_parameters(model), group)` (sequence_parallel.py).
`tp_rank` is the rank loop that reads top to bottom: the oracle's weights sliced, SGD steps on batch_at's batches.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..config import Config, check_bool, check_choice, check_float, check_int, check_seed, check_timeout
from .corpus import batch_at, make_corpus
from .model import GPT, MLP, Block, GPTShape, build_gpt, lm_loss
from .sequence_parallel import GatherSequence, ScatterSequence, sequence_chunk, sum_replicated_grads
from .tensor_group import HOW, TensorGroup, bytes_by_op

#: How each split tensor of a Block is cut: by output rows (dim 0) of a column-split linear's weight, or by input
#: columns (dim 1) of a row-split one. Everything else (norms, the row-split linears' biases) is held whole.
SPLIT_DIM = {"attn.qkv.weight": 0, "attn.qkv.bias": 0, "attn.proj.weight": 1,
             "mlp.fc.weight": 0, "mlp.fc.bias": 0, "mlp.proj.weight": 1}


def shard_of(name: str, full: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    """Rank `rank`'s slice of the full model's parameter `name` (its `SPLIT_DIM` cut into `size` equal parts)."""
    dim = next((d for suffix, d in SPLIT_DIM.items() if name.endswith(suffix)), None)
    return full if dim is None else full.chunk(size, dim=dim)[rank]


class CopyToTensorRanks(torch.autograd.Function):
    """Shoeybi et al.'s f: identity forward; backward, the allreduce of the input's gradient over the group."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: TensorGroup) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return ctx.group.all_reduce(grad, "f backward"), None


class SumOverTensorRanks(torch.autograd.Function):
    """Shoeybi et al.'s g: allreduce of the partial outputs forward; identity backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: TensorGroup) -> torch.Tensor:
        return group.all_reduce(x, "g forward")

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


class ColumnParallelLinear(nn.Module):
    """Y_r = X A_r: this rank's output columns of a linear; its input passes f (or, with SP, the all-gather g)."""

    def __init__(self, full: nn.Linear, group: TensorGroup, sequence_parallel: bool) -> None:
        super().__init__()
        self.group, self.sequence_parallel = group, sequence_parallel
        self.weight = nn.Parameter(full.weight.detach().chunk(group.size, 0)[group.rank].clone())
        self.bias = nn.Parameter(full.bias.detach().chunk(group.size, 0)[group.rank].clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        enter = GatherSequence if self.sequence_parallel else CopyToTensorRanks
        return F.linear(enter.apply(x, self.group), self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """Y = Σ_r X_r B_r + b: this rank's input rows of a linear, partial sums added by g (with SP, reduce-scattered
    by ḡ), then the bias once."""

    def __init__(self, full: nn.Linear, group: TensorGroup, sequence_parallel: bool) -> None:
        super().__init__()
        self.group, self.sequence_parallel = group, sequence_parallel
        self.weight = nn.Parameter(full.weight.detach().chunk(group.size, 1)[group.rank].clone())
        self.bias = nn.Parameter(full.bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        leave = ScatterSequence if self.sequence_parallel else SumOverTensorRanks
        return leave.apply(F.linear(x, self.weight), self.group) + self.bias


def check_splits(shape: GPTShape, size: int, sequence_parallel: bool) -> None:
    """Raise ValueError naming the field when a GPT of `shape` cannot be split over N_tp = `size` ranks."""
    if shape.heads % size:
        raise ValueError(f"heads (a={shape.heads}) must be a multiple of N_tp={size}: each rank holds whole heads")
    if shape.hidden % size:
        raise ValueError(f"mlp_ratio·width ({shape.hidden}) must be a multiple of N_tp={size}")
    if sequence_parallel and shape.seq_len % size:
        raise ValueError(f"seq_len ({shape.seq_len}) must be a multiple of N_tp={size} for sequence parallelism")
    if shape.experts:
        raise ValueError(f"experts must be 0 for tensor parallelism here (the MLP is split, not the experts), "
                         f"got {shape.experts}")


def shard_block_for_tp(block: Block, group: TensorGroup, sequence_parallel: bool = False) -> Block:
    """This rank's copy of `block` (left unchanged) with its four linears split; the same Block.forward runs it."""
    if not isinstance(block.mlp, MLP):
        raise ValueError("experts must be 0 for tensor parallelism here: the block's MLP is a mixture of experts")
    heads = block.attn.qkv.out_features // (3 * block.attn.head_dim)
    if heads % group.size or block.mlp.fc.out_features % group.size:
        raise ValueError(f"heads (a={heads}) and the MLP's hidden width ({block.mlp.fc.out_features}) must be "
                         f"multiples of N_tp={group.size}")
    out = copy.deepcopy(block)
    out.attn.qkv = ColumnParallelLinear(block.attn.qkv, group, sequence_parallel)
    out.attn.proj = RowParallelLinear(block.attn.proj, group, sequence_parallel)
    out.mlp.fc = ColumnParallelLinear(block.mlp.fc, group, sequence_parallel)
    out.mlp.proj = RowParallelLinear(block.mlp.proj, group, sequence_parallel)
    return out


def shard_gpt(model: GPT, group: TensorGroup, sequence_parallel: bool = False) -> GPT:
    """This rank's GPT: every block split (shard_block_for_tp), embeddings, final norm and head held whole."""
    check_splits(model.shape, group.size, sequence_parallel)
    out = copy.deepcopy(model)
    out.blocks = nn.ModuleList(shard_block_for_tp(b, group, sequence_parallel) for b in model.blocks)
    return out


def replicated_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The parameters every rank of the group holds whole: all but the split linears' weights (and column biases)."""
    split = {id(p) for m in model.modules() if isinstance(m, ColumnParallelLinear) for p in (m.weight, m.bias)}
    split |= {id(m.weight) for m in model.modules() if isinstance(m, RowParallelLinear)}
    return [p for p in model.parameters() if id(p) not in split]


@dataclass(frozen=True)
class TPConfig(Config):
    """A GPT of `shape` split over N_tp = `tp` ranks (with sequence parallelism or not): `steps` SGD steps."""

    shape: GPTShape = field(default_factory=GPTShape)
    tp: int = 2
    sequence_parallel: bool = False
    how: str = "ring"
    batch: int = 8
    steps: int = 3
    lr: float = 0.1
    seed: int = 0
    corpus_tokens: int = 20_000
    threads: int = 1  # torch intra-op threads per rank
    device: str = "cpu"  # run_tp's ranks: "cpu" (gloo), "cuda" (NCCL, a GPU per rank) or "auto"
    timeout_s: float = 60.0  # each collective's wait
    run_timeout_s: float = 600.0  # the whole run on the cluster

    def validate(self) -> None:
        if not isinstance(self.shape, GPTShape):
            raise ValueError(f"shape must be a GPTShape, got {type(self.shape).__name__}")
        check_int("tp", self.tp, 1, 16)
        check_bool("sequence_parallel", self.sequence_parallel)
        check_splits(self.shape, self.tp, self.sequence_parallel)
        check_choice("how", self.how, HOW)
        check_int("batch", self.batch, 1, 4096)
        check_int("steps", self.steps, 1, 100_000)
        check_float("lr", self.lr, 0.0, 10.0, lo_open=True)
        check_seed(self.seed)
        check_int("corpus_tokens", self.corpus_tokens, self.shape.seq_len + 1, 10_000_000)
        check_int("threads", self.threads, 1, 64)
        check_choice("device", self.device, ("auto", "cpu", "cuda"))
        check_timeout("timeout_s", self.timeout_s)
        check_timeout("run_timeout_s", self.run_timeout_s, 86400.0)


def tp_rank(group: TensorGroup, config: TPConfig, keep_grads: bool = True,
            emit: Callable[..., None] | None = None) -> dict[str, Any]:
    """One rank: slice the oracle's GPT, run SGD steps on the global batches; its losses, gradients and records.

    `loss` is this rank's share of each step's loss (under SP the shares add up to it over the group); `emit`, when
    given, gets one "update" event per step with the share, the step's time and the bytes each collective sent.
    """
    torch.set_num_threads(config.threads)
    sp, s, device = config.sequence_parallel, config.shape.seq_len, group.comm.device
    model = shard_gpt(build_gpt(config.shape, config.seed), group, sp).to(device)
    replicated = replicated_parameters(model)
    corpus = make_corpus(config.seed, config.corpus_tokens, config.shape.vocab)
    tokens = sequence_chunk(group.rank, group.size, s) if sp else slice(0, s)  # SP: this rank's s/N_tp tokens
    positions = torch.arange(s, device=device)[tokens]
    out: dict[str, Any] = {"loss": [], "grads": [], "step_s": [], "records": []}
    for step in range(config.steps):
        inputs, targets = batch_at(corpus, step, None, config.batch, s, config.seed)
        inputs, targets = inputs[:, tokens].to(device), targets[:, tokens].to(device)
        t0 = time.perf_counter()
        model.zero_grad(set_to_none=False)
        loss = lm_loss(model(inputs, positions=positions), targets)
        share = loss / group.size if sp else loss  # SP: this rank's chunk's share of the mean over B·s tokens
        share.backward()
        if sp:
            sum_replicated_grads(replicated, group)  # norms, biases, embeddings, head: each saw s/N_tp tokens
        with torch.no_grad():
            for p in model.parameters():
                p.add_(p.grad, alpha=-config.lr)
        out["step_s"].append(time.perf_counter() - t0)
        out["loss"].append(float(share.detach()))
        out["records"].append(group.take_records())
        if emit is not None:
            sent = bytes_by_op(out["records"][-1])
            emit(step=step, event="update", loss_share=out["loss"][-1], step_s=out["step_s"][-1],
                 bytes_sent=sum(sent.values()), **sent, version_read=step, version_applied=step + 1)
        if keep_grads:
            out["grads"].append({n: p.grad.detach().clone() for n, p in model.named_parameters()})
    out["params"] = {n: p.detach().clone() for n, p in model.named_parameters()}
    return out
