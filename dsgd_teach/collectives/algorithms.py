"""Allreduce (sum) by hand, with point-to-point messages only: the naive star, the chunked ring, and the registry.

Each function takes a Comm and this rank's tensor (any shape, strides and gloo-reducible dtype) and returns a new
tensor of the same shape and dtype holding the sum over all ranks; every message goes through Comm.exchange and
is therefore counted. Recursive doubling, the binomial tree and halving-doubling live in logarithmic.py.
`library` is torch.distributed.all_reduce, the professional reference (gloo or NCCL), whose messages we cannot see.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from ..runtime.ranks.comm import Comm
from .layout import chunk_offsets, chunk_sizes, doubling_layout
from .logarithmic import (
    binomial_allreduce,
    binomial_schedule,
    doubling_allreduce,
    doubling_schedule,
    halving_doubling_allreduce,
    halving_doubling_schedule,
)
from .tensors import check_reducible, flat_copy, restore


def ring_send_chunk(rank: int, n: int, phase: str, step: int) -> int:
    """Which chunk `rank` sends to its right neighbour in the given phase and step."""
    return (rank - step) % n if phase == "reduce-scatter" else (rank + 1 - step) % n


def ring_schedule(k: int, n: int) -> list[dict[str, int | str]]:
    """Every message of the ring on a length-k vector over n ranks: step, phase, src, dst, chunk, elements.

    Reduce-scatter: in step t rank r sends chunk (r - t) to r + 1, which adds it in; after n - 1 steps rank r holds
    the finished chunk r + 1. All-gather: in step t rank r forwards chunk (r + 1 - t), receivers overwrite.
    """
    sizes = chunk_sizes(k, n)
    out: list[dict[str, int | str]] = []
    for phase_no, phase in enumerate(("reduce-scatter", "all-gather")):
        for t in range(n - 1):
            for r in range(n):
                c = ring_send_chunk(r, n, phase, t)
                if sizes[c]:
                    out.append({"step": phase_no * (n - 1) + t, "phase": phase, "src": r, "dst": (r + 1) % n,
                                "chunk": c, "elements": sizes[c]})
    return out


def ring_allreduce(comm: Comm, x: torch.Tensor) -> torch.Tensor:
    """Bandwidth-optimal ring (Patarasuk & Yuan 2009): 2(N-1) steps, each sending one chunk of about K/N."""
    N, r = comm.world, comm.rank
    out = flat_copy(comm, x, "ring_allreduce")  # a contiguous 1-D copy: any shape or strides, same dtype
    bounds = chunk_offsets(out.numel(), N)
    right, left = (r + 1) % N, (r - 1) % N
    buf = torch.empty(max(chunk_sizes(out.numel(), N)), dtype=out.dtype, device=out.device)
    for phase_no, phase in enumerate(("reduce-scatter", "all-gather")):
        for t in range(N - 1):
            c_send = ring_send_chunk(r, N, phase, t)
            c_recv = ring_send_chunk(left, N, phase, t)
            send = out[bounds[c_send] : bounds[c_send + 1]]
            lo, hi = bounds[c_recv], bounds[c_recv + 1]
            incoming = buf[: hi - lo]
            comm.exchange(send, right, incoming, left, step=phase_no * (N - 1) + t, phase=phase, chunk=c_send)
            if phase == "reduce-scatter":
                out[lo:hi] += incoming
            else:
                out[lo:hi] = incoming
    return restore(out, x)  # back to the input's shape and dtype


def naive_allreduce(comm: Comm, x: torch.Tensor, root: int = 0) -> torch.Tensor:
    """The parameter-server shape: everyone sends its whole vector to root, root adds and sends the sum back.

    Root handles 2(n-1) full-size messages one after another, so its link is the bottleneck.
    """
    n, r = comm.world, comm.rank
    out = flat_copy(comm, x, "naive_allreduce")
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
    return restore(out, x)


def library_allreduce(comm: Comm, x: torch.Tensor) -> torch.Tensor:
    """torch.distributed.all_reduce (gloo or NCCL's own algorithms): the reference; its messages are not logged."""
    check_reducible(comm, x, "library_allreduce")
    out = x.detach().clone(memory_format=torch.contiguous_format)
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
    "doubling": doubling_allreduce,
    "binomial": binomial_allreduce,
    "halving-doubling": halving_doubling_allreduce,
    "ring": ring_allreduce,
    "library": library_allreduce,
}
HAND_WRITTEN = ("naive", "doubling", "binomial", "halving-doubling", "ring")
#: Old names still accepted: "tree" was this package's first name for recursive doubling (a butterfly, not a
#: tree); the course's simulator still uses it. New code names "doubling" or the real tree, "binomial".
ALIASES = {"tree": "doubling"}


def resolve(name: str) -> str:
    """The registered name an algorithm name or alias stands for ("tree" -> "doubling")."""
    return ALIASES.get(name, name)


def check_algorithm(field: str, value: object) -> None:
    """Raise ValueError naming `field` and the allowed algorithms unless value names one (or an alias)."""
    if not isinstance(value, str) or resolve(value) not in ALGORITHMS:
        raise ValueError(f"{field} must be one of {', '.join(map(repr, ALGORITHMS))}; got {value!r}")


def get_allreduce(name: str) -> Allreduce:
    """The allreduce function registered as `name` (or its alias); ValueError naming the known ones."""
    try:
        return ALGORITHMS[resolve(name)]
    except KeyError:
        raise ValueError(f"unknown allreduce {name!r}; known: {', '.join(ALGORITHMS)}") from None


def schedule(algorithm: str, k: int, n: int) -> list[dict[str, int | str]]:
    """Every non-empty message a hand-written allreduce sends on a length-k vector over n ranks."""
    name = resolve(algorithm)
    if name == "ring":
        return ring_schedule(k, n)
    if name == "naive":
        gather = [{"step": i, "phase": "gather", "src": p, "dst": 0, "elements": k} for i, p in enumerate(range(1, n))]
        bcast = [{"step": n - 1 + i, "phase": "broadcast", "src": 0, "dst": p, "elements": k}
                 for i, p in enumerate(range(1, n))]
        return gather + bcast if k else []
    planners = {"doubling": doubling_schedule, "binomial": binomial_schedule,
                "halving-doubling": halving_doubling_schedule}
    if name not in planners:
        raise ValueError(f"no schedule for algorithm {algorithm!r}; known: {', '.join(HAND_WRITTEN)}")
    return planners[name](k, n)


def elements_sent(algorithm: str, k: int, n: int, rank: int) -> int:
    """How many elements `rank` sends in one allreduce of a length-k vector (closed form, checked by the tests)."""
    name = resolve(algorithm)
    if name not in HAND_WRITTEN:
        raise ValueError(f"no byte count for algorithm {algorithm!r}; known: {HAND_WRITTEN}")
    if n == 1 or k == 0:
        return 0
    if name == "ring":
        sizes = chunk_sizes(k, n)
        # Reduce-scatter sends every chunk but (rank + 1), all-gather every chunk but (rank + 2).
        return 2 * k - sizes[(rank + 1) % n] - sizes[(rank + 2) % n]
    if name == "naive":
        return (n - 1) * k if rank == 0 else k
    if name == "doubling":
        p, extra = doubling_layout(n)
        rounds = p.bit_length() - 1
        if rank < 2 * extra:
            return k if rank % 2 == 0 else (rounds + 1) * k
        return rounds * k
    return sum(int(m["elements"]) for m in schedule(name, k, n) if m["src"] == rank)
