"""Allreduces in a logarithmic number of steps: recursive doubling, binomial tree, recursive halving-doubling.

Costs in the alpha-beta model (alpha seconds per message, beta seconds per byte, B = bytes of the vector) are
those Thakur, Rabenseifner & Gropp (2005) give for MPICH's allreduce algorithms:
* recursive doubling, a butterfly: log2(N) steps, partners r and r XOR 2^i swap whole vectors:
  log2(N) * (alpha + beta * B);
* binomial tree: reduce to rank 0, then broadcast back down the same tree: 2 * ceil(log2 N) * (alpha + beta * B);
* recursive halving-doubling (Rabenseifner): a reduce-scatter that halves the data each step, then an all-gather
  that doubles it: 2 * log2(N) * alpha + 2 * (N - 1) / N * B * beta.
When N is not a power of two, doubling and halving-doubling first fold the extra ranks in, as MPICH does: of the
first 2 * (N - p) ranks, each even one sends its vector to the next odd one and sits out; afterwards the odd one
sends the result back. That costs two more steps of alpha + beta * B.
"""

from __future__ import annotations

import torch

from ..runtime.ranks.comm import Comm
from .layout import chunk_offsets, doubling_layout, folded_rank, tree_rounds, unfolded_rank
from .tensors import flat_copy, restore

Message = dict[str, int | str]


def fold_in(comm: Comm, out: torch.Tensor, buf: torch.Tensor) -> int:
    """Fold the ranks beyond the largest power of two into a partner; returns the next step number."""
    n, r = comm.world, comm.rank
    _, extra = doubling_layout(n)
    if not extra:
        return 0
    if r < 2 * extra and r % 2 == 0:
        comm.exchange(out, r + 1, step=0, phase="fold")
    elif r < 2 * extra:
        comm.exchange(recv=buf, src=r - 1, step=0, phase="fold")
        out += buf
    return 1


def fold_out(comm: Comm, out: torch.Tensor, step: int) -> None:
    """Hand the finished sum back to the ranks that sat out."""
    r = comm.rank
    _, extra = doubling_layout(comm.world)
    if r < 2 * extra and r % 2 == 0:
        comm.exchange(recv=out, src=r + 1, step=step, phase="unfold")
    elif r < 2 * extra:
        comm.exchange(out, r - 1, step=step, phase="unfold")


def doubling_allreduce(comm: Comm, x: torch.Tensor) -> torch.Tensor:
    """Recursive doubling (a butterfly): in round i partners r and r XOR 2^i swap whole partial sums and add."""
    out = flat_copy(comm, x, "doubling_allreduce")  # a contiguous 1-D copy of any shape
    buf = torch.empty_like(out)
    p, _ = doubling_layout(comm.world)
    step = fold_in(comm, out, buf)
    vrank = folded_rank(comm.rank, comm.world)
    mask = 1
    while mask < p:
        if vrank is not None:
            peer = unfolded_rank(vrank ^ mask, comm.world)
            comm.exchange(out, peer, buf, peer, step=step, phase="doubling")
            out += buf
        step += 1
        mask *= 2
    fold_out(comm, out, step)
    return restore(out, x)


def binomial_allreduce(comm: Comm, x: torch.Tensor) -> torch.Tensor:
    """Binomial tree: reduce up to rank 0 in ceil(log2 N) rounds, then broadcast down the same edges."""
    n, r = comm.world, comm.rank
    out = flat_copy(comm, x, "binomial_allreduce")
    buf = torch.empty_like(out)
    rounds = tree_rounds(n)
    for i in range(rounds):  # reduce: in round i, ranks r = 2^i (mod 2^(i+1)) send their sum to their parent
        mask = 1 << i
        if r % (2 * mask) == mask:
            comm.exchange(out, r - mask, step=i, phase="reduce")
        elif r % (2 * mask) == 0 and r + mask < n:
            comm.exchange(recv=buf, src=r + mask, step=i, phase="reduce")
            out += buf
    for i in reversed(range(rounds)):  # broadcast: the same edges, from the root down
        mask, step = 1 << i, 2 * rounds - 1 - i
        if r % (2 * mask) == 0 and r + mask < n:
            comm.exchange(out, r + mask, step=step, phase="broadcast")
        elif r % (2 * mask) == mask:
            comm.exchange(recv=out, src=r - mask, step=step, phase="broadcast")
    return restore(out, x)


def halving_doubling_allreduce(comm: Comm, x: torch.Tensor) -> torch.Tensor:
    """Rabenseifner: reduce-scatter by recursive halving, then all-gather by recursive doubling."""
    out = flat_copy(comm, x, "halving_doubling_allreduce")
    buf = torch.empty_like(out)
    p, _ = doubling_layout(comm.world)
    bounds = chunk_offsets(out.numel(), p)  # p chunks; participant v ends the reduce-scatter owning chunk v
    step = fold_in(comm, out, buf)
    vrank = folded_rank(comm.rank, comm.world)
    lo, hi = 0, p  # the chunks this rank is still responsible for
    mask = p // 2
    while mask:  # halving: keep the half of the window on my side of bit `mask`, send the other half
        if vrank is not None:
            peer, mid = unfolded_rank(vrank ^ mask, comm.world), (lo + hi) // 2
            (lo, hi), (glo, ghi) = ((lo, mid), (mid, hi)) if vrank & mask == 0 else ((mid, hi), (lo, mid))
            a, b = bounds[lo], bounds[hi]
            comm.exchange(out[bounds[glo]:bounds[ghi]], peer, buf[: b - a], peer, step=step, phase="halving")
            out[a:b] += buf[: b - a]
        step += 1
        mask //= 2
    mask = 1
    while mask < p:  # doubling: swap finished windows with the partner, so each window doubles
        if vrank is not None:
            peer, plo = unfolded_rank(vrank ^ mask, comm.world), lo ^ mask
            mine, theirs = out[bounds[lo]:bounds[hi]], out[bounds[plo]:bounds[plo + mask]]
            comm.exchange(mine, peer, theirs, peer, step=step, phase="doubling")
            lo, hi = min(lo, plo), max(hi, plo + mask)
        step += 1
        mask *= 2
    fold_out(comm, out, step)
    return restore(out, x)


def _fold_messages(k: int, n: int, step: int, phase: str) -> list[Message]:
    _, extra = doubling_layout(n)
    pairs = [(2 * i, 2 * i + 1) for i in range(extra)]
    return [{"step": step, "phase": phase, "src": a if phase == "fold" else b, "dst": b if phase == "fold" else a,
             "elements": k} for a, b in pairs]


def doubling_schedule(k: int, n: int) -> list[Message]:
    """Every message of recursive doubling on a length-k vector over n ranks (empty messages left out)."""
    if k == 0 or n < 2:
        return []
    p, extra = doubling_layout(n)
    out, step = _fold_messages(k, n, 0, "fold"), int(extra > 0)
    for i in range(p.bit_length() - 1):
        out += [{"step": step + i, "phase": "doubling", "src": unfolded_rank(v, n),
                 "dst": unfolded_rank(v ^ (1 << i), n), "elements": k} for v in range(p)]
    return out + _fold_messages(k, n, step + p.bit_length() - 1, "unfold")


def binomial_schedule(k: int, n: int) -> list[Message]:
    """Every message of the binomial-tree allreduce (reduce, then broadcast) on a length-k vector over n ranks."""
    if k == 0 or n < 2:
        return []
    rounds, out = tree_rounds(n), []
    for i in range(rounds):
        mask = 1 << i
        for r in range(mask, n, 2 * mask):
            out.append({"step": i, "phase": "reduce", "src": r, "dst": r - mask, "elements": k})
            out.append({"step": 2 * rounds - 1 - i, "phase": "broadcast", "src": r - mask, "dst": r, "elements": k})
    return sorted(out, key=lambda m: (m["step"], m["src"]))


def halving_doubling_schedule(k: int, n: int) -> list[Message]:
    """Every message of recursive halving-doubling on a length-k vector over n ranks (empty ones left out)."""
    if k == 0 or n < 2:
        return []
    p, extra = doubling_layout(n)
    bounds, log_p = chunk_offsets(k, p), p.bit_length() - 1
    out, step = _fold_messages(k, n, 0, "fold"), int(extra > 0)
    for v in range(p):
        lo, hi = 0, p
        for i, mask in enumerate(p >> (j + 1) for j in range(log_p)):
            mid = (lo + hi) // 2
            (lo, hi), (glo, ghi) = ((lo, mid), (mid, hi)) if v & mask == 0 else ((mid, hi), (lo, mid))
            out.append({"step": step + i, "phase": "halving", "src": unfolded_rank(v, n),
                        "dst": unfolded_rank(v ^ mask, n), "elements": bounds[ghi] - bounds[glo]})
        for i in range(log_p):
            mask = 1 << i
            out.append({"step": step + log_p + i, "phase": "doubling", "src": unfolded_rank(v, n),
                        "dst": unfolded_rank(v ^ mask, n), "elements": bounds[hi] - bounds[lo]})
            plo = lo ^ mask
            lo, hi = min(lo, plo), max(hi, plo + mask)
    out += _fold_messages(k, n, step + 2 * log_p, "unfold")
    return sorted((m for m in out if m["elements"]), key=lambda m: (m["step"], m["src"]))
