"""Allreduce (sum) by hand, with point-to-point messages only: naive, recursive doubling, and the chunked ring.

Each function takes a Comm and this rank's tensor and returns a new tensor holding the sum over all ranks; every
message goes through Comm.exchange and is therefore counted. `library` is torch.distributed.all_reduce, the
professional reference (gloo or NCCL), whose messages we cannot see.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from .comm import Comm


def chunk_sizes(k: int, n: int) -> list[int]:
    """Sizes of the n ring chunks of a length-k vector: k // n each, the first k % n one element longer."""
    return [k // n + (1 if i < k % n else 0) for i in range(n)]


def chunk_offsets(k: int, n: int) -> list[int]:
    """Start index of each chunk (len n + 1, the last entry is k)."""
    out = [0]
    for size in chunk_sizes(k, n):
        out.append(out[-1] + size)
    return out


def ring_send_chunk(rank: int, n: int, phase: str, step: int) -> int:
    """Which chunk `rank` sends to its right neighbour in the given phase and step."""
    return (rank - step) % n if phase == "reduce-scatter" else (rank + 1 - step) % n


def ring_schedule(k: int, n: int) -> list[dict[str, int | str]]:
    """Every message of the ring on a length-k vector over n ranks: step, phase, src, dst, chunk, elements.

    Reduce-scatter: in step s rank r sends chunk (r - s) to r + 1, which adds it in; after n - 1 steps rank r holds
    the finished chunk r + 1. All-gather: in step s rank r forwards chunk (r + 1 - s), receivers overwrite.
    """
    sizes = chunk_sizes(k, n)
    out: list[dict[str, int | str]] = []
    for phase_no, phase in enumerate(("reduce-scatter", "all-gather")):
        for s in range(n - 1):
            for r in range(n):
                c = ring_send_chunk(r, n, phase, s)
                if sizes[c]:
                    out.append({"step": phase_no * (n - 1) + s, "phase": phase, "src": r, "dst": (r + 1) % n,
                                "chunk": c, "elements": sizes[c]})
    return out


def ring_allreduce(comm: Comm, x: torch.Tensor) -> torch.Tensor:
    """Bandwidth-optimal ring (Patarasuk & Yuan 2009): 2(n-1) steps, each sending one chunk of about k/n."""
    n, r = comm.world, comm.rank
    out = x.clone()
    if n == 1:
        return out
    bounds = chunk_offsets(out.numel(), n)
    right, left = (r + 1) % n, (r - 1) % n
    buf = torch.empty(max(chunk_sizes(out.numel(), n)), dtype=x.dtype, device=x.device)
    for phase_no, phase in enumerate(("reduce-scatter", "all-gather")):
        for s in range(n - 1):
            c_send = ring_send_chunk(r, n, phase, s)
            c_recv = ring_send_chunk(left, n, phase, s)
            send = out[bounds[c_send] : bounds[c_send + 1]]
            lo, hi = bounds[c_recv], bounds[c_recv + 1]
            incoming = buf[: hi - lo]
            comm.exchange(send, right, incoming, left, step=phase_no * (n - 1) + s, phase=phase, chunk=c_send)
            if phase == "reduce-scatter":
                out[lo:hi] += incoming
            else:
                out[lo:hi] = incoming
    return out


def naive_allreduce(comm: Comm, x: torch.Tensor, root: int = 0) -> torch.Tensor:
    """The parameter-server shape: everyone sends its whole vector to root, root adds and sends the sum back.

    Root handles 2(n-1) full-size messages one after another, so its link is the bottleneck.
    """
    n, r = comm.world, comm.rank
    out = x.clone()
    others = [p for p in range(n) if p != root]
    buf = torch.empty_like(out)
    for i, peer in enumerate(others):
        if r == root:
            comm.exchange(recv=buf, src=peer, step=i, phase="gather")
            out += buf
        elif r == peer:
            comm.exchange(out, root, step=i, phase="gather")
    for i, peer in enumerate(others):
        step = len(others) + i
        if r == root:
            comm.exchange(out, peer, step=step, phase="broadcast")
        elif r == peer:
            comm.exchange(recv=out, src=root, step=step, phase="broadcast")
    return out


def doubling_layout(n: int) -> tuple[int, int]:
    """(p, extra): the largest power of two p <= n, and extra = n - p ranks that fold into a partner first."""
    p = 1
    while p * 2 <= n:
        p *= 2
    return p, n - p


def doubling_allreduce(comm: Comm, x: torch.Tensor) -> torch.Tensor:
    """Recursive doubling: log2(n) rounds, partners r and r XOR 2^i swap their whole partial sums.

    For n not a power of two, the first 2*extra ranks pair up: even ones hand their vector to the odd neighbour,
    sit out the rounds, and get the result back at the end (two extra steps).
    """
    n, r = comm.world, comm.rank
    out = x.clone()
    p, extra = doubling_layout(n)
    buf = torch.empty_like(out)
    step = 0
    if extra:
        if r < 2 * extra and r % 2 == 0:
            comm.exchange(out, r + 1, step=0, phase="fold")
        elif r < 2 * extra:
            comm.exchange(recv=buf, src=r - 1, step=0, phase="fold")
            out += buf
        step = 1
    sitting_out = r < 2 * extra and r % 2 == 0
    vrank = (r // 2) if r < 2 * extra else r - extra  # rank among the p that take part
    mask = 1
    while mask < p:
        if not sitting_out:
            vpeer = vrank ^ mask
            peer = vpeer * 2 + 1 if vpeer < extra else vpeer + extra
            comm.exchange(out, peer, buf, peer, step=step, phase="doubling")
            out += buf
        step += 1
        mask *= 2
    if extra:
        if sitting_out:
            comm.exchange(recv=out, src=r + 1, step=step, phase="unfold")
        elif r < 2 * extra:
            comm.exchange(out, r - 1, step=step, phase="unfold")
    return out


def library_allreduce(comm: Comm, x: torch.Tensor) -> torch.Tensor:
    """torch.distributed.all_reduce (gloo or NCCL's own algorithms): the reference; its messages are not logged."""
    out = x.clone()
    comm.wait_all([dist.all_reduce(out, op=dist.ReduceOp.SUM, async_op=True)])
    return out


def recv_first_exchange(comm: Comm, x: torch.Tensor) -> torch.Tensor:
    """A classic bug: every rank waits to receive before it sends, so nobody ever sends (times out, by design)."""
    out = x.clone()
    if comm.world > 1:
        comm.exchange(recv=out, src=(comm.rank - 1) % comm.world, step=0, phase="recv-first")
        comm.exchange(out, (comm.rank + 1) % comm.world, step=1, phase="recv-first")
    return out


Allreduce = Callable[[Comm, torch.Tensor], torch.Tensor]

#: The algorithms a config may name; "library" is the reference, the others are written by hand.
ALGORITHMS: dict[str, Allreduce] = {
    "naive": naive_allreduce,
    "tree": doubling_allreduce,
    "ring": ring_allreduce,
    "library": library_allreduce,
}
HAND_WRITTEN = ("naive", "tree", "ring")


def elements_sent(algorithm: str, k: int, n: int, rank: int) -> int:
    """How many elements `rank` sends in one allreduce of a length-k vector (closed form, checked by the tests)."""
    if n == 1 or k == 0:
        return 0
    if algorithm == "ring":
        sizes = chunk_sizes(k, n)
        # Reduce-scatter sends every chunk but (rank + 1), all-gather every chunk but (rank + 2).
        return 2 * k - sizes[(rank + 1) % n] - sizes[(rank + 2) % n]
    if algorithm == "naive":
        return (n - 1) * k if rank == 0 else k
    if algorithm == "tree":
        p, extra = doubling_layout(n)
        rounds = p.bit_length() - 1
        if rank < 2 * extra:
            return k if rank % 2 == 0 else (rounds + 1) * k
        return rounds * k
    raise ValueError(f"no byte count for algorithm {algorithm!r}; known: {HAND_WRITTEN}")

