"""The step coordinator and the parameter server as one rank sees them: plain calls with named replies.

The rank loops of chapter 04 (sync.py's `sync_worker`, async_sgd.py's `async_worker`) call these and read as the
algorithm; the deadlines, the "pending" replies, the stop signal and the trace's columns live here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..runtime.actors import ActorCalls
from ..runtime.ranks.live import WorkerContext
from .onebit import raw_nbytes


@dataclass
class Step:
    """What a rank holds between steps: the coordinator's status ("run", "done", "stopped"), version and w_t."""

    status: str
    version: int
    w: np.ndarray | None

    @property
    def running(self) -> bool:
        """True while the run goes on."""
        return self.status == "run"


@dataclass
class PushReply:
    """What became of a rank's gradient, and the step it goes on with."""

    verdict: str  # "aggregated", "discarded" (it came after its step completed) or "cancelled" (never sent)
    waited_s: float  # seconds spent waiting for the step to complete
    uplink_bytes: int
    completed: dict[str, Any] | None  # the step's timing row, when this gradient completed it
    next: Step


class StepServer:
    """The synchronous step coordinator (actors.SyncCoordinator) seen from one rank."""

    def __init__(self, coordinator: Any, ctx: WorkerContext, timeout_s: float) -> None:
        self.calls = ActorCalls(coordinator, ctx, timeout_s, packed=("push",), what="the step coordinator")

    def join(self, rank: int) -> Step:
        """Start together with every other rank (nobody races ahead while the others load); then w_0."""
        self.calls("join", rank)
        return Step(*self.calls("pull", -1))

    def stopping(self) -> bool:
        """True once the lecturer pressed Stop."""
        return self.calls.stopping()

    def straggle(self, version: int, delay_s: float, cut_short: bool) -> tuple[float, bool]:
        """Sit out an injected straggler delay; with cut_short (backups), leave it once step `version` completed
        without this rank. Returns (seconds sat out, whether the step completed meanwhile)."""
        if delay_s <= 0:
            return 0.0, False
        if not cut_short:
            time.sleep(delay_s)
            return delay_s, False
        t0 = time.perf_counter()
        completed = self.calls("wait_past", version, delay_s, extra_s=delay_s) > version
        sat = time.perf_counter() - t0
        return (sat if completed else max(delay_s, sat)), completed

    def push(self, rank: int, version: int, payload: Any, rows: int, loss: float, busy_s: float) -> PushReply:
        """Deliver a gradient computed on w_version; returns once the step it belongs to has completed."""
        verdict, waited, nbytes, completed, *step = self.calls("push", rank, version, payload, rows, loss, busy_s)
        return self._settled(PushReply(verdict, waited, nbytes, completed, Step(*step)), version)

    def skip(self, version: int) -> PushReply:
        """Drop this rank's gradient for `version` unsent (the step completed without it); the next step."""
        return self._settled(PushReply("cancelled", 0.0, 0, None, Step("pending", version, None)), version)

    def _settled(self, reply: PushReply, version: int) -> PushReply:
        """The reply, its next step waited for if the coordinator had not completed step `version` yet."""
        if reply.next.status == "pending":
            reply.next = Step(*self.calls("pull", version))
            reply.waited_s += self.calls.last_s
        return reply


def record_push(ctx: WorkerContext, version: int, reply: PushReply, loss: float, grad: np.ndarray,
                t_begin: float, compute_s: float, delay_s: float, exchange_s: float) -> None:
    """The trace's row for one gradient of a synchronous step: what became of it, and where its time went."""
    aggregated = reply.verdict == "aggregated"
    new_w = reply.next.w
    ctx.emit(
        step=version, event="gradient" if aggregated else reply.verdict, loss=loss, version_read=version,
        version_applied=version + 1 if aggregated else -1, injected_delay=delay_s,
        bytes_sent=reply.uplink_bytes + (new_w.nbytes if new_w is not None else 0), uplink_bytes=reply.uplink_bytes,
        raw_uplink_bytes=raw_nbytes(grad.size), t_begin=t_begin, compute_s=compute_s,
        wait_s=min(reply.waited_s, exchange_s), comm_s=max(0.0, exchange_s - reply.waited_s),
    )


def record_step(ctx: WorkerContext, reply: PushReply, steps: int, eval_every: int) -> None:
    """The trace's row for a step this rank's gradient completed (the parameters on evaluation steps)."""
    done, new_w = reply.completed, reply.next.w
    if done is None or new_w is None:
        return
    v = done["version"]
    snapshot = (v + 1) % eval_every == 0 or v + 1 == steps
    ctx.emit(
        worker=-1, step=v, event="update", loss=done["loss"], version_read=v, version_applied=v + 1,
        step_s=done["step_s"], slowest_busy_s=done["slowest_busy_s"], aggregated=",".join(map(str, done["aggregated"])),
        **({"params": new_w.tolist()} if snapshot else {}),
    )


class ParameterServer:
    """The asynchronous parameter server (actors.AsyncServer, or the chapter-03 server behind ps_adapter) seen from
    one rank."""

    def __init__(self, server: Any, ctx: WorkerContext, timeout_s: float) -> None:
        self.calls = ActorCalls(server, ctx, timeout_s, what="the parameter server")

    def join(self, rank: int) -> None:
        """Start together with every other rank."""
        self.calls("join", rank)

    def stopping(self) -> bool:
        """True once the lecturer pressed Stop."""
        return self.calls.stopping()

    def pull(self, rank: int) -> Step:
        """The current parameters (waits while a staleness gate holds this rank back)."""
        return Step(*self.calls("pull", rank))

    def push(self, rank: int, grad: np.ndarray) -> dict[str, Any] | None:
        """Apply a gradient; its receipt (versions, staleness, step scale), or None once the run has ended."""
        receipt = self.calls("push", rank, grad)
        return receipt if receipt["status"] == "applied" else None


def record_async_push(ctx: WorkerContext, k: int, receipt: dict[str, Any], loss: float, w: np.ndarray,
                      t_begin: float, compute_s: float, delay_s: float, comm_s: float) -> None:
    """The trace's row for one applied asynchronous gradient (the parameters when the server sent them)."""
    snapshot = receipt.get("params")
    ctx.emit(
        step=k, event="push", loss=loss, version_read=receipt["version_read"],
        version_applied=receipt["version_applied"], staleness=receipt["staleness"],
        bytes_sent=receipt["bytes"] + w.nbytes, injected_delay=delay_s, lr_scale=receipt["scale"],
        t_begin=t_begin, compute_s=compute_s, wait_s=0.0, comm_s=comm_s,
        **({"params": snapshot.tolist()} if snapshot is not None else {}),
    )
