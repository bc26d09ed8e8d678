"""Point-to-point messages that count themselves: every send and receive is logged with its bytes and step.

The hand-written allreduces talk only through Comm.exchange, so the log is a complete record of who sent how
many bytes to whom in which communication step; each wait is bounded by the group's timeout. Comm keeps the log
and the exchange contract; how the bytes travel is its transport's business: torch.distributed point-to-point
(gloo or NCCL, one process per rank) by default, or queues between threads of one process (`thread_group.py`).
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
import torch.distributed as dist


def wait_for(work: Any, timeout_s: float, what: str, hint: str = "is a peer dead or stalled?") -> None:
    """Wait for one torch.distributed operation; a timeout or a closed peer raises TimeoutError naming `what`."""
    started = time.monotonic()
    try:
        done = work.wait(timeout=datetime.timedelta(seconds=timeout_s))
    except RuntimeError as exc:  # gloo raises on its own timeout or when a peer's connection closes
        waited = time.monotonic() - started
        how = (f"did not complete within {timeout_s} s" if waited >= 0.9 * timeout_s
               else f"failed after {waited:.2f} s")
        raise TimeoutError(f"{what} {how} ({hint}): {exc}") from exc
    if done is False:
        raise TimeoutError(f"{what} did not complete within {timeout_s} s")


class Transport(Protocol):
    """How a Comm's messages travel: post one send and one receive together, return when both are done."""

    def exchange(self, comm: Comm, send: torch.Tensor | None, dst: int | None, recv: torch.Tensor | None,
                 src: int | None) -> None:
        """Send `send` to dst and fill `recv` from src (None: no such half; empty tensors never arrive here)."""
        ...


class TorchDistributed:
    """The default transport: torch.distributed isend/irecv in the current process group, each wait bounded."""

    group: Any = None  # the process group the peers are ranks of (None: the default group)

    def peer(self, rank: int) -> int:
        """The process-group rank of the Comm's rank `rank`."""
        return rank

    def exchange(self, comm: Comm, send: torch.Tensor | None, dst: int | None, recv: torch.Tensor | None,
                 src: int | None) -> None:
        """Post the receive and the send, then wait for both (posting both first keeps a ring from deadlocking)."""
        self.exchange_all(comm, [(send, dst, recv, src)])

    def exchange_all(self, comm: Comm, pairs: list[tuple[torch.Tensor | None, int | None, torch.Tensor | None,
                                                         int | None]], sends_first: bool = False,
                     meanwhile: Callable[[], None] | None = None) -> None:
        """Post every (send, dst, recv, src) pair's receive and send at once, in order (every send before any
        receive with sends_first), run `meanwhile` while they travel, then wait for them all."""
        ops = []
        for send, dst, recv, src in pairs:
            if recv is not None:
                ops.append(dist.P2POp(dist.irecv, recv, self.peer(src), self.group))
            if send is not None:
                ops.append(dist.P2POp(dist.isend, send.contiguous(), self.peer(dst), self.group))
        if sends_first:
            ops.sort(key=lambda op: op.op is not dist.isend)  # stable: the sends in order, then the receives
        if comm.device.type == "cuda":
            # NCCL must launch the pairs together (one group call), or two ranks sending to each other deadlock.
            works = dist.batch_isend_irecv(ops)
        else:
            # gloo queues non-blocking ops independently; plain isend/irecv skip batch_isend_irecv's overhead.
            works = [op.op(op.tensor, op.peer, op.group) for op in ops]
        if meanwhile is not None:
            meanwhile()
        comm.wait_all(works)


@dataclass
class Comm:
    """This rank's handle on its group: exchange() for messages, `log` for what was sent and received.

    `transport` moves the bytes: torch.distributed (the default, one process per rank) or threads of one process.
    """

    rank: int
    world: int
    device: torch.device
    timeout_s: float
    log: list[dict[str, Any]] = field(default_factory=list)
    transport: Transport = field(default_factory=TorchDistributed, repr=False)

    def exchange(
        self,
        send: torch.Tensor | None = None,
        dst: int | None = None,
        recv: torch.Tensor | None = None,
        src: int | None = None,
        *,
        step: int,
        phase: str,
        chunk: int = -1,
    ) -> None:
        """Send `send` to dst and receive into `recv` from src at the same time (either may be None or empty).

        Both are logged before the transport moves them, so the log reads the same whichever transport is used.
        """
        for name, tensor in (("send", send), ("recv", recv)):
            if tensor is not None and not isinstance(tensor, torch.Tensor):
                raise TypeError(f"rank {self.rank}: exchange moves torch tensors; {name} is a {type(tensor).__name__}")
        if recv is not None and recv.numel() > 0:
            self._note("recv", src, recv, step, phase, chunk)
        else:
            recv = None
        if send is not None and send.numel() > 0:
            self._note("send", dst, send, step, phase, chunk)
        else:
            send = None
        if send is not None or recv is not None:
            self.transport.exchange(self, send, dst, recv, src)

    def exchange_all(self, pairs: list[tuple[torch.Tensor | None, int | None, torch.Tensor | None, int | None]], *,
                     phase: str, chunks: list[int] | None = None, sends_first: bool = False,
                     meanwhile: Callable[[], None] | None = None) -> None:
        """Many exchanges at once: pair i, (send, dst, recv, src), is step i of the log; every pair is posted before
        any is waited for, so each must be matched by its peers' (a transport without exchange_all runs them in turn),
        every send before any receive with sends_first; `meanwhile` (local work) runs once all are posted, before
        the waits (first, on a transport that runs them in turn).
        """
        moving = []
        for i, (send, dst, recv, src) in enumerate(pairs):
            chunk = chunks[i] if chunks is not None else -1
            recv = recv if recv is not None and recv.numel() > 0 else None
            send = send if send is not None and send.numel() > 0 else None
            if recv is not None:
                self._note("recv", src, recv, i, phase, chunk)
            if send is not None:
                self._note("send", dst, send, i, phase, chunk)
            if send is not None or recv is not None:
                moving.append((send, dst, recv, src))
        post_all = getattr(self.transport, "exchange_all", None)
        if post_all is not None:
            post_all(self, moving, sends_first, meanwhile)
        else:
            if meanwhile is not None:
                meanwhile()
            for send, dst, recv, src in moving:
                self.transport.exchange(self, send, dst, recv, src)

    def wait_all(self, works: list[Any], what: str = "a message") -> None:
        """Wait for pending operations, failing after the group's timeout instead of hanging."""
        for work in works:
            wait_for(work, self.timeout_s, f"rank {self.rank}: {what}")
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _note(self, direction: str, peer: int | None, tensor: torch.Tensor, step: int, phase: str, chunk: int) -> None:
        src, dst = (self.rank, peer) if direction == "send" else (peer, self.rank)
        self.log.append({
            "rank": self.rank, "direction": direction, "src": src, "dst": dst, "step": step, "phase": phase,
            "chunk": chunk, "elements": int(tensor.numel()), "bytes": int(tensor.numel() * tensor.element_size()),
        })

    def take_log(self) -> list[dict[str, Any]]:
        """The messages logged since the last call (and clear the log)."""
        out, self.log = self.log, []
        return out

    def bytes_sent(self) -> int:
        """Bytes this rank has sent since the log was last taken."""
        return sum(m["bytes"] for m in self.log if m["direction"] == "send")
