"""Ranks as threads of one process: the course's Comm with queues for wires instead of a process group.

`run_threads(fn, inputs)` runs fn(comm, inputs[r]) on one thread per rank, each with its own Comm whose transport
is a ThreadTransport. A message is a copy of the sent tensor put on the queue from its sender to its receiver and
taken off in the order it was sent, which is how torch.distributed matches point-to-point messages between two
ranks; Comm logs it exactly as it does over gloo. Every receive waits at most the Comm's timeout and then raises
TimeoutError naming both ranks; when a rank fails the others stop waiting at once; a message nobody received is
an error as well (over gloo its sender would wait for it). Nothing here needs a port, a process or a dask worker,
so a grader can run every rank's program inside one notebook kernel.
"""

from __future__ import annotations

import operator
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from .comm import Comm


class RankFailed(RuntimeError):
    """A rank's program raised; the original exception is the __cause__, `rank` says whose it was."""

    def __init__(self, rank: int, error: BaseException) -> None:
        super().__init__(f"rank {rank} failed: {type(error).__name__}: {error}")
        self.rank, self.error = rank, error


class PeerFailed(RuntimeError):
    """This rank stopped waiting because another rank had already failed."""


@dataclass(frozen=True)
class _Abort:
    """Put on every queue when a rank fails, so that ranks blocked on a receive stop at once."""

    rank: int


class ThreadTransport:
    """Comm's transport between threads: one FIFO queue per (sender, receiver) pair, every wait bounded."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.queues = {(a, b): queue.SimpleQueue() for a in range(world) for b in range(world)}

    def exchange(self, comm: Comm, send: torch.Tensor | None, dst: int | None, recv: torch.Tensor | None,
                 src: int | None) -> None:
        """Post a copy of `send` for dst, then take src's oldest message into `recv` (waiting comm.timeout_s)."""
        if send is not None:
            dst = self._peer(comm, "dst", dst)
            self._contiguous(comm, "send", send)
            self.post(comm.rank, dst, send.detach().clone())
        if recv is not None:
            src = self._peer(comm, "src", src)
            self._contiguous(comm, "recv", recv)
            got = self.take(comm, src)
            if got.dtype != recv.dtype or got.numel() != recv.numel():
                raise ValueError(f"rank {comm.rank}: rank {src} sent {got.numel()} elements of {got.dtype}, but the "
                                 f"receive buffer holds {recv.numel()} of {recv.dtype}")
            with torch.no_grad():
                recv.copy_(got.reshape(recv.shape))

    def post(self, src: int, dst: int, tensor: torch.Tensor) -> None:
        """Deliver one message from src to dst (never blocks)."""
        self.queues[(src, dst)].put(tensor)

    def take(self, comm: Comm, src: int) -> torch.Tensor:
        """The oldest message from src to this rank; TimeoutError after comm.timeout_s, PeerFailed on an abort."""
        try:
            got = self.queues[(src, comm.rank)].get(timeout=comm.timeout_s)
        except queue.Empty:
            raise TimeoutError(
                f"rank {comm.rank}: no message from rank {src} within {comm.timeout_s} s "
                f"(does rank {src} send to rank {comm.rank} in this step?)"
            ) from None
        if isinstance(got, _Abort):
            raise PeerFailed(f"rank {comm.rank}: stopped waiting for rank {src} because rank {got.rank} failed")
        return got

    def abort(self, failed: int) -> None:
        """Wake every blocked receive: rank `failed` has failed."""
        for box in self.queues.values():
            box.put(_Abort(failed))

    def undelivered(self) -> dict[tuple[int, int], int]:
        """(sender, receiver) -> messages sent but never received."""
        return {pair: box.qsize() for pair, box in self.queues.items() if not box.empty()}

    def _peer(self, comm: Comm, name: str, peer: Any) -> int:
        try:
            peer = operator.index(peer)
        except TypeError:
            peer = -1
        if not 0 <= peer < self.world:
            raise ValueError(f"rank {comm.rank}: {name} must be a rank in 0..{self.world - 1}, got {peer!r}")
        return peer

    @staticmethod
    def _contiguous(comm: Comm, name: str, tensor: torch.Tensor) -> None:
        if not tensor.is_contiguous():  # torch.distributed refuses these as well
            raise ValueError(f"rank {comm.rank}: the {name} tensor must be contiguous (take .contiguous() or a copy)")


class ThreadRun(NamedTuple):
    """What every rank returned, and every rank's Comm log, in rank order."""

    results: list[Any]
    logs: list[list[dict[str, Any]]]


def run_threads(fn: Callable[[Comm, Any], Any], inputs: Sequence[Any], *, timeout_s: float = 5.0,
                run_timeout_s: float = 60.0, transport: type[ThreadTransport] = ThreadTransport) -> ThreadRun:
    """fn(comm, inputs[r]) on one thread per rank r, each with its own Comm; (results, logs).

    The first rank to raise is re-raised as RankFailed (its exception chained); a run still going after
    run_timeout_s raises TimeoutError naming the ranks left; messages never received raise RuntimeError.
    """
    world = len(inputs)
    if world < 1:
        raise ValueError("run_threads needs at least one rank (inputs is empty)")
    wires = transport(world)
    comms = [Comm(r, world, torch.device("cpu"), timeout_s, transport=wires) for r in range(world)]
    results: list[Any] = [None] * world
    done: queue.SimpleQueue[tuple[int, BaseException | None]] = queue.SimpleQueue()

    def body(r: int) -> None:
        try:
            results[r] = fn(comms[r], inputs[r])
            done.put((r, None))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread below
            done.put((r, exc))

    for r in range(world):
        threading.Thread(target=body, args=(r,), name=f"rank-{r}", daemon=True).start()
    deadline, running, first = time.monotonic() + run_timeout_s, set(range(world)), None
    while running:
        try:
            r, exc = done.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            if first is not None:  # a rank failed and another is still computing: report the failure
                break
            wires.abort(-1)
            raise TimeoutError(f"ranks {sorted(running)} still running after {run_timeout_s} s "
                               "(is one stuck in a loop?)") from None
        running.discard(r)
        if exc is not None and first is None:
            first = (r, exc)
            wires.abort(r)  # the others stop at their next receive instead of timing out one by one
    if first is not None:
        raise RankFailed(*first) from first[1]
    left = wires.undelivered()
    if left:
        said = ", ".join(f"{n} from rank {a} to rank {b}" for (a, b), n in sorted(left.items()))
        raise RuntimeError(f"messages sent but never received: {said} (every send needs a matching receive)")
    return ThreadRun(results, [c.log for c in comms])
