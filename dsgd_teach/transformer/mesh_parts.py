"""What one rank of a mesh holds and reads: its slice of the GPT, its tokens, and the memory its step holds.

composed.py's rank loop calls these; each is a pure function of the layout, the rank's coordinates and the full
model, so the driver can cut the single-process oracle's trained model the same way and compare slice by slice.
"""

from __future__ import annotations

import copy
import weakref
from typing import Any

import torch
from torch import nn

from ..pipeline.stages import stage_bounds
from ..runtime.ranks.comm import Comm
from .expert_parallel import ExpertParallelMoE
from .mesh import AXES, Layout, Mesh
from .model import GPT, causal_attention
from .ring_attention import positions as ring_positions
from .ring_attention import ring_attention
from .sequence_parallel import sequence_chunk
from .tensor_group import TensorGroup
from .tensor_parallel import ColumnParallelLinear, RowParallelLinear, shard_block_for_tp


class StagePart(nn.Module):
    """A pipeline stage's part of the GPT on one rank: embeddings (first stage), its blocks, ln_f + head (last)."""

    def __init__(self, model: GPT, layout: Layout, coords: dict[str, int], blocks: list[nn.Module],
                 attend: Any, tokens: int) -> None:
        super().__init__()
        stage = coords["pp"]
        self.first, self.last = stage == 0, stage == layout.pp - 1
        self.tok_emb = model.tok_emb if self.first else None
        self.pos_emb = model.pos_emb if self.first else None
        self.blocks = nn.ModuleList(blocks)
        self.ln_f = model.ln_f if self.last else None
        self.head = model.head if self.last else None
        self.attend = attend
        self.tensor_group: TensorGroup | None = None  # the tensor axis's collectives, when N_tp > 1
        self.block_ids = list(range(*stage_bounds(len(model.blocks), layout.pp)[stage]))
        self.width, self.tokens = model.shape.width, tokens  # the activations' sequence positions on this rank

    def routing_stats(self) -> list[tuple[int, dict[str, Any]]]:
        """(block, its mixture of experts' routing in the last forward) for each expert layer of this stage."""
        return [(self.block_ids[i], {("forward_bytes" if k == "bytes_sent" else k): v for k, v in b.mlp.stats.items()})
                for i, b in enumerate(self.blocks) if isinstance(getattr(b.mlp, "stats", None), dict) and b.mlp.stats]

    def boundary_shape(self, rows: int) -> tuple[int, int, int]:
        """The shape of the activations this stage receives for a microbatch of `rows` sequences."""
        return (rows, self.tokens, self.width)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Tokens (first stage) or the previous stage's activations -> activations, or logits on the last stage."""
        if self.tok_emb is not None and self.pos_emb is not None:
            x = self.tok_emb(x) + self.pos_emb(positions)
        for block in self.blocks:
            x = block(x, attend=self.attend)
        if self.ln_f is not None and self.head is not None:
            x = self.head(self.ln_f(x))
        return x


def stage_blocks(model: GPT, layout: Layout, stage: int) -> list[nn.Module]:
    """The blocks pipeline stage `stage` owns: a contiguous run of the L blocks, as even as possible."""
    start, stop = stage_bounds(len(model.blocks), layout.pp)[stage]
    return list(model.blocks[start:stop])


def build_part(model: GPT, config: Any, mesh: Mesh) -> StagePart:
    """This rank's part of `model` (left unchanged): its stage's blocks, cut over the tensor axis (and, with sequence
    parallelism, its tokens), attending by ring over the context axis, holding its experts on the expert axis."""
    layout, coords = config.layout, mesh.coords
    blocks = [copy.deepcopy(b) for b in stage_blocks(model, layout, coords["pp"])]
    group = tensor_group(mesh) if layout.tp > 1 else None
    if group is not None:
        blocks = [tensor_parallel_block(b, group, config.sequence_parallel) for b in blocks]
    if layout.ep > 1:
        for block in blocks:
            block.mlp = ExpertParallelMoE(block.mlp, comm=mesh.comms["ep"])
    attend = causal_attention
    if layout.cp > 1:
        cp, balanced = mesh.comms["cp"], config.balanced

        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return ring_attention(cp, q, k, v, balanced)
    part = StagePart(model, layout, coords, blocks, attend, len(rank_positions(config, coords)))
    part.tensor_group = group
    return part


def tensor_group(mesh: Mesh) -> TensorGroup:
    """The tensor axis's collectives (chapter 05's ring on the axis's Comm, every message counted)."""
    return TensorGroup(mesh.comms["tp"], "ring", mesh.groups.get("tp"))


def tensor_parallel_block(block: nn.Module, group: TensorGroup, sequence_parallel: bool) -> nn.Module:
    """The block with its heads and MLP columns split over the tensor axis (tensor_parallel.py); a block whose MLP
    is a mixture of experts has its attention split and its experts held whole on every tensor rank."""
    if block.mlp.__class__.__name__ != "MoE":
        return shard_block_for_tp(block, group, sequence_parallel)
    out = copy.deepcopy(block)
    out.attn.qkv = ColumnParallelLinear(block.attn.qkv, group, sequence_parallel)
    out.attn.proj = RowParallelLinear(block.attn.proj, group, sequence_parallel)
    return out


def expert_parameters(part: nn.Module) -> list[nn.Parameter]:
    """The parameters of the experts this rank holds alone on its expert axis (each sums only over edp)."""
    return [p for m in part.modules() if isinstance(m, ExpertParallelMoE) for p in m.experts.parameters()]


def detached_mesh(layout: Layout, coords: dict[str, int], device: str = "cpu") -> Mesh:
    """A Mesh at `coords` whose Comms talk to nobody: build_part cuts the oracle's model with it."""
    comms = {axis: Comm(coords[axis], getattr(layout, axis), torch.device(device), 1.0) for axis in AXES}
    return Mesh(layout, -1, coords, comms)


def rank_positions(config: Any, coords: dict[str, int]) -> torch.Tensor:
    """The sequence positions this rank holds: all s, or its context chunks (two mirrored ones when balanced), and
    of those, with sequence parallelism, its tensor rank's contiguous 1/N_tp."""
    held = ring_positions(coords["cp"], config.cp, config.shape.seq_len, config.balanced and config.cp > 1)
    if config.sequence_parallel:
        held = held[sequence_chunk(coords["tp"], config.tp, len(held))]
    return held


def rank_rows(layout: Layout, coords: dict[str, int], batch: int) -> slice:
    """The rows of the step's global batch this rank's data-parallel index reads: B/N_dp consecutive ones."""
    per = batch // layout.dp
    return slice(coords["dp"] * per, (coords["dp"] + 1) * per)


class SavedBytes:
    """The bytes of the tensors autograd keeps for backward (each storage once), now and at most, on this rank.

    Used as `torch.autograd.graph.saved_tensors_hooks(sb.pack, sb.unpack)`: a saved tensor counts from the forward
    that saves it until the graph holding it is freed (its backward ran). Parameters are left out (`exclude`).
    """

    def __init__(self, exclude: set[int]) -> None:
        self.exclude, self.live, self.now, self.peak = exclude, {}, 0, 0

    def reset_peak(self) -> None:
        """Start a new step's peak from what is held now."""
        self.peak = self.now

    def pack(self, t: torch.Tensor) -> Any:
        """Count t's storage (once however many tensors share it) while the graph holds it."""
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key in self.exclude or storage.nbytes() == 0:
            return t
        entry = self.live.setdefault(key, [storage.nbytes(), 0])
        if entry[1] == 0:
            self.now += entry[0]
            self.peak = max(self.peak, self.now)
        entry[1] += 1
        return Held(t, key, self)

    @staticmethod
    def unpack(held: Any) -> torch.Tensor:
        """The tensor back, for backward."""
        return held.tensor if isinstance(held, Held) else held

    def release(self, key: int) -> None:
        """One holder of storage `key` is gone; the storage stops counting when the last one is."""
        entry = self.live[key]
        entry[1] -= 1
        if entry[1] == 0:
            self.now -= entry[0]
            del self.live[key]


class Held:
    """A saved tensor's stand-in in the graph: tells its SavedBytes when the graph lets it go."""

    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor: torch.Tensor, key: int, owner: SavedBytes) -> None:
        self.tensor = tensor
        weakref.finalize(self, owner.release, key)


def state_bytes(module: nn.Module) -> int:
    """Bytes of a module's parameters and their gradients (plain SGD keeps no optimizer state)."""
    return sum(2 * p.numel() * p.element_size() for p in module.parameters())


def parameter_storages(module: nn.Module) -> set[int]:
    """The storage addresses of a module's parameters (SavedBytes leaves them out)."""
    return {p.untyped_storage().data_ptr() for p in module.parameters()}
