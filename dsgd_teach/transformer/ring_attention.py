"""Context parallelism by ring attention: N_cp ranks each hold a piece of the sequence; keys and values go round a ring.

Ring attention (Liu, Zaharia & Abbeel 2023, "Ring Attention with Blockwise Transformers for Near-Infinite Context",
section 3): rank r holds its tokens' q, k and v. In step i = 0, ..., N_cp - 1 it attends with its q to the key/value
block that started on rank r - i, then passes that block to rank r + 1 and takes the next from rank r - 1 (the ring
of chapter 05, over the course's Comm). After N_cp steps every query has met every key, and no rank ever held more
than its own piece and one visiting block. Here a rank computes, then passes the block on (Comm.exchange waits for
its messages); Liu et al. overlap the two, which hides the ring's time whenever a block's compute takes longer than
its transfer.

Merging the blocks: attention over keys split in blocks is exact if each block's result carries its log-sum-exp
l = log sum_j exp(s_j); two partial results (o_1, l_1), (o_2, l_2) over disjoint keys merge to
l = log(exp l_1 + exp l_2), o = exp(l_1 - l) o_1 + exp(l_2 - l) o_2 (the online softmax: Milakov & Gimelshein 2018,
"Online normalizer calculation for softmax", algorithm 3; Dao et al. 2022, "FlashAttention", section 3.1).

Backward (Dao et al. 2022, appendix B.2, the gradient from the saved l): with P = exp(S - l), D = rowsum(dO * O),
dV = P^T dO, dS = P * (dO V^T - D), dQ = dS K / sqrt(h/a), dK = dS^T Q / sqrt(h/a). Key/value blocks go round the
ring again, each carrying the dK, dV accumulated for it so far; after a last hop every block's dK, dV is home.

Causal masking and load balance: the sequence is cut into chunks. A query chunk needs only the key chunks at or
before it (the diagonal one masked), so with one contiguous chunk per rank the last rank computes N_cp blocks and
the first one: imbalance 2 N_cp / (N_cp + 1). Cutting into 2 N_cp chunks and giving rank r chunks r and
2 N_cp - 1 - r (the layout of Megatron-LM's context parallelism, its `get_batch_on_this_cp_rank`, NVIDIA 2024;
Brandon et al. 2023, "Striped Attention: Faster Ring Attention for Causal Transformers", balance by striping single
tokens instead) gives every rank 2 N_cp + 1 of the smaller blocks (`work_per_rank`): imbalance 1.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from ..runtime.ranks.comm import Comm
from .model import Attend


def chunk_ids(rank: int, world: int, balanced: bool) -> tuple[int, ...]:
    """The sequence chunks rank holds: (r,) of N_cp chunks, or (r, 2 N_cp - 1 - r) of 2 N_cp when balanced."""
    if not 0 <= rank < world:
        raise ValueError(f"rank must be in [0, {world - 1}], got {rank}")
    return (rank, 2 * world - 1 - rank) if balanced else (rank,)


def chunks_total(world: int, balanced: bool) -> int:
    """How many chunks the sequence is cut into: 2 N_cp when balanced, else N_cp."""
    return 2 * world if balanced else world


def shard_sequence(x: torch.Tensor, rank: int, world: int, balanced: bool, dim: int = -2) -> torch.Tensor:
    """This rank's piece of a full sequence x (its chunks along `dim`, concatenated in order)."""
    n = chunks_total(world, balanced)
    if x.shape[dim] % n:
        raise ValueError(f"the sequence length {x.shape[dim]} must be a multiple of {n} "
                         f"({'2·' if balanced else ''}N_cp chunks for N_cp = {world})")
    pieces = x.chunk(n, dim=dim)
    return torch.cat([pieces[c] for c in chunk_ids(rank, world, balanced)], dim=dim)


def unshard_sequence(pieces: list[torch.Tensor], balanced: bool, dim: int = -2) -> torch.Tensor:
    """The full sequence from every rank's piece (in rank order): the inverse of shard_sequence."""
    world = len(pieces)
    chunks: dict[int, torch.Tensor] = {}
    for rank, piece in enumerate(pieces):
        ids = chunk_ids(rank, world, balanced)
        chunks.update(zip(ids, piece.chunk(len(ids), dim=dim), strict=True))
    return torch.cat([chunks[c] for c in range(chunks_total(world, balanced))], dim=dim)


def positions(rank: int, world: int, seq_len: int, balanced: bool) -> torch.Tensor:
    """The global positions of this rank's tokens (for position embeddings of a sequence shard)."""
    return shard_sequence(torch.arange(seq_len), rank, world, balanced, dim=0)


def block_pairs(rank: int, world: int, balanced: bool) -> list[tuple[int, int, int, int]]:
    """(step, index of the query chunk here, index of the key chunk in the visiting block, diagonal?) computed.

    In step i the visiting block is the one rank r - i started with; a key chunk after the query chunk is skipped,
    the same chunk is the diagonal (masked), an earlier one is attended in full.
    """
    mine = chunk_ids(rank, world, balanced)
    out = []
    for step in range(world):
        theirs = chunk_ids((rank - step) % world, world, balanced)
        for qi, qc in enumerate(mine):
            for kj, kc in enumerate(theirs):
                if kc <= qc:
                    out.append((step, qi, kj, int(kc == qc)))
    return out


def work_per_rank(world: int, seq_len: int, balanced: bool) -> list[int]:
    """Attention scores each rank computes per batch row and head: blocks computed times (chunk length)²."""
    c = seq_len // chunks_total(world, balanced)
    return [len(block_pairs(r, world, balanced)) * c * c for r in range(world)]


def imbalance(work: list[int]) -> float:
    """max / mean of the work per rank: 1 is balanced; the busiest rank sets the step time."""
    return max(work) * len(work) / sum(work)


def ring_attention_bytes(world: int, local_elements: int, element_size: int, backward: bool = True) -> int:
    """Bytes each rank sends for one ring attention, given the elements of its k (= of its v).

    Forward: N_cp - 1 hops of its visiting k and v. Backward: N_cp - 1 hops of k, v, dK and dV, then one hop of
    dK and dV home.
    """
    if world == 1:
        return 0
    block = local_elements * element_size
    forward = (world - 1) * 2 * block
    return forward + ((world - 1) * 4 * block + 2 * block if backward else 0)


def block_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, diagonal: bool) -> tuple[torch.Tensor, ...]:
    """(o, l): softmax attention of q to one key block and its log-sum-exp; `diagonal` masks keys after queries."""
    scores = scores_of(q, k, diagonal)
    lse = torch.logsumexp(scores, dim=-1)
    return torch.exp(scores - lse.unsqueeze(-1)) @ v, lse


def scores_of(q: torch.Tensor, k: torch.Tensor, diagonal: bool) -> torch.Tensor:
    """q kᵀ / √(h/a), with the future masked to -inf on a diagonal block."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if diagonal:
        future = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
    return scores


def merge(o1: torch.Tensor, l1: torch.Tensor, o2: torch.Tensor, l2: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The online-softmax merge of two partial attentions over disjoint keys: (o, l)."""
    lse = torch.logaddexp(l1, l2)
    return torch.exp(l1 - lse).unsqueeze(-1) * o1 + torch.exp(l2 - lse).unsqueeze(-1) * o2, lse


def pass_round(comm: Comm, block: torch.Tensor, step: int, phase: str) -> torch.Tensor:
    """Send block to rank r + 1 and return the one rank r - 1 sends (one step of the ring)."""
    incoming = torch.empty_like(block)
    comm.exchange(block, (comm.rank + 1) % comm.world, incoming, (comm.rank - 1) % comm.world,
                  step=step, phase=phase)
    return incoming


class RingAttention(torch.autograd.Function):
    """Causal attention of this rank's q to every rank's k, v by ring, and its backward by ring."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, comm: Comm, balanced: bool,
                work: dict[str, int] | None) -> torch.Tensor:
        pairs = block_pairs(comm.rank, comm.world, balanced)
        c = q.shape[-2] // len(chunk_ids(comm.rank, comm.world, balanced))
        qs = q.split(c, dim=-2)
        out = [torch.zeros_like(part) for part in qs]
        lse = [torch.full(part.shape[:-1], float("-inf"), dtype=q.dtype, device=q.device) for part in qs]
        kv = torch.stack([k, v]).contiguous()
        computing = 0.0
        for step in range(comm.world):
            started = time.perf_counter()
            ks, vs = kv[0].split(c, dim=-2), kv[1].split(c, dim=-2)
            for _, qi, kj, diagonal in (p for p in pairs if p[0] == step):
                o_b, l_b = block_attention(qs[qi], ks[kj], vs[kj], bool(diagonal))
                out[qi], lse[qi] = merge(out[qi], lse[qi], o_b, l_b)
            computing += time.perf_counter() - started
            if step < comm.world - 1:
                kv = pass_round(comm, kv, step, "ring-attention kv")
        if work is not None:
            work["blocks"] = work.get("blocks", 0) + len(pairs)
            work["scores"] = work.get("scores", 0) + len(pairs) * c * c
            work["compute_s"] = work.get("compute_s", 0.0) + computing
        o = torch.cat(out, dim=-2)
        ctx.save_for_backward(q, k, v, o, torch.cat(lse, dim=-1))
        ctx.comm, ctx.balanced, ctx.pairs, ctx.c = comm, balanced, pairs, c
        return o

    @staticmethod
    def backward(ctx: Any, grad_o: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, o, lse = ctx.saved_tensors
        comm, pairs, c = ctx.comm, ctx.pairs, ctx.c
        scale = 1.0 / math.sqrt(q.shape[-1])
        delta = (grad_o * o).sum(dim=-1)  # D = rowsum(dO * O)
        qs, dos, ls, ds = (t.split(c, dim=-1 if t.dim() == 3 else -2) for t in (q, grad_o, lse, delta))
        dq = torch.zeros_like(q)
        dqs = dq.split(c, dim=-2)
        block = torch.stack([k, v, torch.zeros_like(k), torch.zeros_like(v)]).contiguous()  # k, v, dk, dv
        for step in range(comm.world):
            ks, vs, dks, dvs = (t.split(c, dim=-2) for t in block)
            for _, qi, kj, diagonal in (p for p in pairs if p[0] == step):
                p = torch.exp(scores_of(qs[qi], ks[kj], bool(diagonal)) - ls[qi].unsqueeze(-1))
                dvs[kj].add_(p.transpose(-2, -1) @ dos[qi])
                d_scores = p * (dos[qi] @ vs[kj].transpose(-2, -1) - ds[qi].unsqueeze(-1))
                dqs[qi].add_(d_scores @ ks[kj], alpha=scale)
                dks[kj].add_(d_scores.transpose(-2, -1) @ qs[qi], alpha=scale)
            if comm.world == 1:
                break
            if step < comm.world - 1:
                block = pass_round(comm, block, step, "ring-attention kv+grad")
            else:  # the last hop: each block's dk, dv go home to the rank that started with it
                block = pass_round(comm, block[2:].contiguous(), step, "ring-attention grad home")
                return dq, block[0], block[1], None, None, None
        return dq, block[2], block[3], None, None, None


def attend_by_ring(comm: Comm, balanced: bool = True, work: dict[str, Any] | None = None) -> Attend:
    """The `attend` a context-parallel rank hands to model.Attention: ring attention over comm."""
    return lambda q, k, v: ring_attention(comm, q, k, v, balanced, work)


def ring_attention(comm: Comm, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, balanced: bool = True,
                   work: dict[str, int] | None = None) -> torch.Tensor:
    """Causal attention for this rank's piece of the sequence ([B, a, s/N_cp, h/a] each), by ring over comm.

    The pieces are shard_sequence's (two mirrored chunks each when balanced); `work`, if given, counts the blocks
    and scores computed in the forward and the seconds spent computing them (not waiting for the ring).
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4 or not t.is_floating_point():
            raise ValueError(f"ring_attention: {name} must be a floating-point [B, a, s/N_cp, h/a] tensor")
        if t.device.type != comm.device.type:
            raise ValueError(f"ring_attention: {name} is on {t.device}, but this rank communicates on {comm.device}")
    if not q.shape == k.shape == v.shape:
        raise ValueError(f"ring_attention: q, k, v must have one shape, got {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")
    if not isinstance(balanced, bool):
        raise ValueError(f"ring_attention: balanced must be True or False, got {balanced!r}")
    per_rank = len(chunk_ids(comm.rank, comm.world, balanced))
    if q.shape[-2] == 0 or q.shape[-2] % per_rank:
        raise ValueError(f"ring_attention: this rank's {q.shape[-2]} positions must be a positive multiple of "
                         f"{per_rank} (the chunks it holds)")
    return RingAttention.apply(q, k, v, comm, balanced, work)
