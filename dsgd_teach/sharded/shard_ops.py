"""Reduce-scatter and all-gather, the two halves of chapter 05's ring, as collectives of their own.

A flat vector whose length is a multiple of N is cut into N equal shards; rank r owns shard r. Reduce-scatter
leaves rank r with the sum of everybody's shard r; all-gather hands every rank every shard. The hand-written
ring versions count every message through Comm.exchange; "library" calls torch.distributed's own, and the
bytes it sends are counted by the same closed form, (N-1)/N of the vector per rank.
"""

from __future__ import annotations

import time
from concurrent.futures import Executor, Future
from typing import Any

import torch
import torch.distributed as dist

from ..runtime.ranks.comm import Comm

HOW = ("ring", "library")


def padded_numel(numel: int, world: int) -> int:
    """numel rounded up to a multiple of world, so that every rank owns an equal shard."""
    return -(-numel // world) * world


def ring_reduce_scatter(comm: Comm, flat: torch.Tensor, phase: str = "reduce-scatter") -> torch.Tensor:
    """Sum flat over ranks and return only this rank's shard: N-1 ring steps, one shard each (flat is untouched)."""
    n, r = comm.world, comm.rank
    size = flat.numel() // n
    work = flat.detach().clone()
    chunk = [work[i * size:(i + 1) * size] for i in range(n)]
    buf = torch.empty(size, dtype=flat.dtype, device=flat.device)
    for s in range(n - 1):
        send, recv = (r - s - 1) % n, (r - s - 2) % n  # after the last step rank r has finished shard r
        comm.exchange(chunk[send], (r + 1) % n, buf, (r - 1) % n, step=s, phase=phase, chunk=send)
        chunk[recv] += buf
    return chunk[r].clone()


def ring_all_gather(comm: Comm, shard: torch.Tensor, phase: str = "all-gather") -> torch.Tensor:
    """Concatenate every rank's shard on every rank: N-1 ring steps, each forwarding one shard to the right."""
    n, r = comm.world, comm.rank
    size = shard.numel()
    out = torch.empty(n * size, dtype=shard.dtype, device=shard.device)
    chunk = [out[i * size:(i + 1) * size] for i in range(n)]
    chunk[r].copy_(shard)
    for s in range(n - 1):
        send, recv = (r - s) % n, (r - s - 1) % n
        comm.exchange(chunk[send], (r + 1) % n, chunk[recv], (r - 1) % n, step=s, phase=phase, chunk=send)
    return out


def _note_library(comm: Comm, x: torch.Tensor, phase: str) -> None:
    """Log what a library collective sends from this rank, (N-1) shards of x's size, as one entry."""
    comm.log.append({"rank": comm.rank, "direction": "send", "src": comm.rank, "dst": -1, "step": 0,
                     "phase": phase, "chunk": -1, "elements": int(x.numel()) * (comm.world - 1),
                     "bytes": int(x.numel() * x.element_size()) * (comm.world - 1)})


def reduce_scatter(comm: Comm, flat: torch.Tensor, how: str = "ring") -> torch.Tensor:
    """This rank's shard of the sum over ranks of flat (length a multiple of N), by ring or library."""
    if flat.numel() % comm.world:
        raise ValueError(f"reduce_scatter: length {flat.numel()} is not a multiple of world {comm.world}")
    if comm.world == 1:
        return flat.detach().clone()
    if how == "ring":
        return ring_reduce_scatter(comm, flat)
    out = torch.empty(flat.numel() // comm.world, dtype=flat.dtype, device=flat.device)
    _note_library(comm, out, "reduce-scatter")
    comm.wait_all([dist.reduce_scatter_tensor(out, flat.detach().contiguous(), async_op=True)], "reduce-scatter")
    return out


def all_gather(comm: Comm, shard: torch.Tensor, how: str = "ring") -> torch.Tensor:
    """Every rank's shard, concatenated in rank order, on every rank, by ring or library."""
    if comm.world == 1:
        return shard.detach().clone()
    if how == "ring":
        return ring_all_gather(comm, shard.detach())
    out = torch.empty(shard.numel() * comm.world, dtype=shard.dtype, device=shard.device)
    _note_library(comm, shard, "all-gather")
    comm.wait_all([dist.all_gather_into_tensor(out, shard.detach().contiguous(), async_op=True)], "all-gather")
    return out


def sent_elements(comm: Comm) -> int:
    """Elements this rank has sent since the log was last taken."""
    return sum(m["elements"] for m in comm.log if m["direction"] == "send")


class Pending:
    """A collective started without waiting for it; wait() gives its result, or fails after the comm's timeout."""

    def __init__(self, comm: Comm, what: str, out: torch.Tensor | None = None, work: Any = None,
                 future: Future[torch.Tensor] | None = None, received: torch.Tensor | None = None) -> None:
        self.comm, self.what, self.out, self.work, self.future = comm, what, out, work, future
        self.received = received  # the direct reduce-scatter's receive buffer, summed into out when waited for
        self.launch_s, self.done_s = time.perf_counter(), 0.0
        if future is not None:
            future.add_done_callback(self._done)
        elif work is not None:
            try:
                work.get_future().then(self._done)
            except RuntimeError:  # gloo's reduce-scatter has no future: its end is noted when it is waited for
                pass
        else:
            self.done_s = self.launch_s

    def _done(self, _: Any) -> None:
        self.done_s = time.perf_counter()

    def wait(self) -> torch.Tensor:
        """The collective's result (this rank's shard, or the whole vector)."""
        if self.future is not None:
            self.out, self.future = self.future.result(timeout=self.comm.timeout_s), None
        elif self.work is not None:
            self.comm.wait_all([self.work], self.what)
            self.work = None
            if self.received is not None:  # every rank's copy of our shard: add them up, in rank order
                assert self.out is not None
                torch.sum(self.received.view(self.comm.world, -1), 0, out=self.out)
                self.received = None
        self.done_s = self.done_s or time.perf_counter()
        assert self.out is not None
        return self.out


def start_reduce_scatter(comm: Comm, flat: torch.Tensor, how: str, pool: Executor | None) -> Pending:
    """Start reduce_scatter(flat) (the ring on pool's thread, or the library's async op); flat must stay unchanged."""
    if comm.world == 1:
        return Pending(comm, "reduce-scatter", out=flat.detach().clone())
    if how == "ring":
        assert pool is not None, "the ring runs on a communication thread"
        return Pending(comm, "reduce-scatter", future=pool.submit(ring_reduce_scatter, comm, flat))
    out = torch.empty(flat.numel() // comm.world, dtype=flat.dtype, device=flat.device)
    _note_library(comm, out, "reduce-scatter")
    if dist.get_backend() != "gloo":
        return Pending(comm, "reduce-scatter", out=out,
                       work=dist.reduce_scatter_tensor(out, flat.detach().contiguous(), async_op=True))
    # On gloo, the direct algorithm: shard j goes straight to rank j (an all-to-all, the same (N-1)/N of the vector
    # per rank as the ring), and each rank adds up the N copies of its shard. gloo's own reduce-scatter took 1.2-2.3x
    # as long (6 MiB fp32 on loopback: 6.9 against 5.7 ms over 2 ranks, 22.4 against 9.7 ms over 4).
    received = torch.empty_like(flat)
    work = dist.all_to_all_single(received, flat.detach().contiguous(), async_op=True)
    return Pending(comm, "reduce-scatter", out=out, work=work, received=received)


def start_all_gather(comm: Comm, shard: torch.Tensor, how: str, pool: Executor | None,
                     out: torch.Tensor | None = None) -> Pending:
    """Start all_gather(shard) into out (a new tensor when None; the ring copies its result there)."""
    if out is None:
        out = torch.empty(shard.numel() * comm.world, dtype=shard.dtype, device=shard.device)
    if comm.world == 1:
        out.copy_(shard)
        return Pending(comm, "all-gather", out=out)
    if how == "ring":
        assert pool is not None, "the ring runs on a communication thread"

        def ring() -> torch.Tensor:
            return out.copy_(ring_all_gather(comm, shard.detach()))

        return Pending(comm, "all-gather", future=pool.submit(ring))
    _note_library(comm, shard, "all-gather")
    return Pending(comm, "all-gather", out=out,
                   work=dist.all_gather_into_tensor(out, shard.detach().contiguous(), async_op=True))


def start_all_reduce(comm: Comm, flat: torch.Tensor, how: str, pool: Executor | None) -> Pending:
    """Start summing flat over ranks in place: the ring's reduce-scatter then all-gather, or the library's allreduce."""
    if comm.world == 1:
        return Pending(comm, "allreduce", out=flat)
    if how == "ring":
        assert pool is not None, "the ring runs on a communication thread"

        def ring() -> torch.Tensor:
            return flat.copy_(ring_all_gather(comm, ring_reduce_scatter(comm, flat)))

        return Pending(comm, "allreduce", future=pool.submit(ring))
    shard = flat[:flat.numel() // comm.world]  # the library sends what a ring would: a reduce-scatter, an all-gather
    _note_library(comm, shard, "reduce-scatter")
    _note_library(comm, shard, "all-gather")
    return Pending(comm, "allreduce", out=flat, work=dist.all_reduce(flat, async_op=True))
