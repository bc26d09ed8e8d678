"""All-to-all by hand, with point-to-point messages only: every rank sends a different block of rows to every rank.

Rank r's input is cut along its first dimension into n blocks of send_splits[0], ..., send_splits[n-1] rows; block j
goes to rank j, and rank r's output is the blocks it received, in the order of the ranks that sent them
(recv_splits[i] rows from rank i), as `torch.distributed.all_to_all_single` (the reference) arranges them.

The schedule is the pairwise exchange of Thakur, Rabenseifner & Gropp 2005 ("Optimization of Collective
Communication Operations in MPICH", IJHPCA 19(1), its all-to-all algorithms): in step s = 1, ..., n-1 rank r sends
to rank r + s and receives from rank r - s (mod n), so every pair of ranks meets once and each step is a matched
exchange. As their algorithm for medium-sized messages does, every step's send and receive is posted at once and then
all are waited for (`Comm.exchange_all`), so the n - 1 steps travel together instead of one after the other, in an
order that spreads each step's messages over different ranks; the block a rank keeps for itself is copied while they
travel. The sends are posted before the receives, as gloo's own all-to-all posts them. Measured on the course's
2-core machine (`make bench`, 2 ranks, 4 MiB a rank, ours over torch's all_to_all_single in the same rounds):
receives first and the copy while they travel, 1.18-1.33 (five runs); receives first and the copy first, 1.26-1.38;
sends first and the copy first, 1.01-1.20 (ten runs, median 1.11); sends first and the copy while they travel,
0.88-1.07 (ten runs, median 0.99). The ring allreduce, which exchanges one pair at a time, was no faster with its
sends first and keeps each pair's receive first. Rank r sends sum over j != r of send_splits[j] rows
(`all_to_all_bytes`). A mixture of experts dispatches tokens to their experts' ranks with it, and combines the experts'
outputs back with the same call, splits swapped, which is also its backward.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from ..runtime.ranks.comm import Comm


def check_splits(comm: Comm, splits: Sequence[int], name: str, rows: int | None = None) -> list[int]:
    """The splits as a list of ints; ValueError unless there is one non-negative count per rank (summing to rows)."""
    try:
        out = [int(s) for s in splits]
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a sequence of {comm.world} non-negative ints, got {splits!r}") from None
    if len(out) != comm.world or any(s < 0 for s in out) or any(s != t for s, t in zip(out, splits, strict=True)):
        raise ValueError(f"{name} must hold {comm.world} non-negative ints (one per rank), got {list(splits)!r}")
    if rows is not None and sum(out) != rows:
        raise ValueError(f"{name} must sum to the input's {rows} rows, got {out} (sum {sum(out)})")
    return out


def offsets(splits: Sequence[int]) -> list[int]:
    """Where each block starts (len n + 1, the last entry is the number of rows)."""
    out = [0]
    for s in splits:
        out.append(out[-1] + s)
    return out


def all_to_all(comm: Comm, x: torch.Tensor, send_splits: Sequence[int], recv_splits: Sequence[int],
               phase: str = "all-to-all") -> torch.Tensor:
    """Send rows [sum send_splits[:j], +send_splits[j]) of x to rank j; return the rows received, by source rank."""
    if not isinstance(x, torch.Tensor) or x.dim() < 1:
        raise ValueError(f"all_to_all: x must be a tensor with at least one dimension, got {x!r:.60}")
    if x.device.type != comm.device.type:
        raise ValueError(f"all_to_all: x is on {x.device}, but this rank communicates on {comm.device}")
    n, r = comm.world, comm.rank
    send = check_splits(comm, send_splits, "send_splits", x.shape[0])
    recv = check_splits(comm, recv_splits, "recv_splits")
    x = x.detach().contiguous()
    out = x.new_empty((sum(recv), *x.shape[1:]))
    at_in, at_out = offsets(send), offsets(recv)
    pairs, chunks = [], []
    for s in range(1, n):  # step s: send to r + s, receive from r - s
        dst, src = (r + s) % n, (r - s) % n
        pairs.append((x[at_in[dst] : at_in[dst + 1]], dst, out[at_out[src] : at_out[src + 1]], src))
        chunks.append(dst)
    def keep_own_block() -> None:  # the block a rank keeps for itself: copied while the others travel
        out[at_out[r] : at_out[r + 1]] = x[at_in[r] : at_in[r + 1]]

    comm.exchange_all(pairs, phase=phase, chunks=chunks, sends_first=True, meanwhile=keep_own_block)
    return out


def exchange_counts(comm: Comm, counts: torch.Tensor) -> torch.Tensor:
    """counts[n, m] (int64): row j goes to rank j; returns [n, m] whose row i came from rank i (an all-to-all)."""
    if counts.dim() != 2 or counts.shape[0] != comm.world:
        raise ValueError(f"exchange_counts: counts must be [{comm.world}, m], got {tuple(counts.shape)}")
    ones = [1] * comm.world
    return all_to_all(comm, counts.to(torch.int64), ones, ones, phase="counts")


def all_to_all_bytes(send_splits: Sequence[int], rank: int, row_bytes: int) -> int:
    """Bytes `rank` sends in one all_to_all: every block but its own, row_bytes each row."""
    return row_bytes * sum(s for j, s in enumerate(send_splits) if j != rank)


class AllToAll(torch.autograd.Function):
    """all_to_all with a gradient: the backward is the same exchange with the splits swapped."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, comm: Comm, send_splits: list[int], recv_splits: list[int],
                phase: str) -> torch.Tensor:
        """Send x's blocks to their ranks; remember the splits for the backward."""
        ctx.comm, ctx.splits, ctx.phase = comm, (send_splits, recv_splits), phase
        return all_to_all(comm, x, send_splits, recv_splits, phase)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        """Each received row's gradient goes back to the rank that sent the row."""
        send_splits, recv_splits = ctx.splits
        return all_to_all(ctx.comm, grad, recv_splits, send_splits, ctx.phase + " backward"), None, None, None, None


def differentiable_all_to_all(comm: Comm, x: torch.Tensor, send_splits: Sequence[int],
                              recv_splits: Sequence[int], phase: str = "all-to-all") -> torch.Tensor:
    """all_to_all that autograd can run backwards (the gradient travels the reverse exchange)."""
    send = check_splits(comm, send_splits, "send_splits", x.shape[0])
    recv = check_splits(comm, recv_splits, "recv_splits")
    return AllToAll.apply(x, comm, send, recv, phase)


def library_all_to_all(comm: Comm, x: torch.Tensor, send_splits: Sequence[int], recv_splits: Sequence[int],
                       group: Any = None) -> torch.Tensor:
    """torch.distributed.all_to_all_single (gloo or NCCL's own): the reference; its messages are not logged."""
    send = check_splits(comm, send_splits, "send_splits", x.shape[0])
    recv = check_splits(comm, recv_splits, "recv_splits")
    x = x.detach().contiguous()
    out = x.new_empty((sum(recv), *x.shape[1:]))
    work = dist.all_to_all_single(out, x, recv, send, group=group, async_op=True)
    comm.wait_all([work], "all_to_all_single")
    return out
