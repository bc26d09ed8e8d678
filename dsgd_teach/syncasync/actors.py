"""The two dask actors of this chapter: the synchronous step coordinator and the asynchronous parameter server.

Both run their methods as coroutines on their worker's event loop (one at a time, so every decision is atomic)
and hand the decisions to the pure rules in schedule.py. A waiting call returns after at most `slice_s` with
status "pending", so worker tasks regain control often enough to notice a stop request; nothing waits forever.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np

from ..ps.optimizers import DEFAULT_DC_LAMBDA, make_optimizer
from ..runtime.actors import pack, unpack
from .onebit import OneBitMessage
from .schedule import StalenessGate, StepLog, SyncRound


def _decode(payload: np.ndarray | OneBitMessage) -> tuple[np.ndarray, int]:
    """The gradient a payload carries and the bytes it took on the wire."""
    if isinstance(payload, OneBitMessage):
        return payload.decode(), payload.nbytes
    arr = np.asarray(payload, dtype=np.float32)
    return arr, int(arr.nbytes)


class _Waitable:
    """An asyncio event re-armed at every state change; created lazily on the worker's event loop."""

    def __init__(self, world: int) -> None:
        self._event: asyncio.Event | None = None
        self.stopped = False
        self.world = world
        self.joined: set[int] = set()

    async def join(self, rank: int) -> str:
        """Start barrier: rank has its data and model ready; "run" once all have ("pending" after one slice)."""
        self.joined.add(rank)
        if len(self.joined) == self.world:
            self.on_start()
            self.notify()
        elif not self.stopped:
            await self.wait(getattr(self, "slice_s", 0.25))
        if self.stopped:
            return "stopped"
        return "run" if len(self.joined) >= self.world else "pending"

    def on_start(self) -> None:
        """Hook run once when every rank has joined."""

    async def ping(self) -> int:
        """A bare actor call (the reference round trip for benchmarks)."""
        return len(self.joined)

    def notify(self) -> None:
        if self._event is not None:
            self._event.set()
        self._event = None

    async def wait(self, timeout: float) -> None:
        if self._event is None:
            self._event = asyncio.Event()
        try:
            await asyncio.wait_for(self._event.wait(), timeout)
        except asyncio.TimeoutError:
            pass

    def stop(self) -> None:
        self.stopped = True
        self.notify()


class SyncCoordinator(_Waitable):
    """Synchronous SGD with backups: aggregates the first `needed` gradients of each step, discards the rest."""

    def __init__(self, params: np.ndarray, needed: int, world: int, lr: float, steps: int, slice_s: float = 0.25):
        super().__init__(world)
        self.w = np.array(params, dtype=np.float32)
        self.lr, self.steps, self.slice_s = np.float32(lr), steps, slice_s
        self.round = SyncRound(needed, world)
        self.parts: list[tuple[float, np.ndarray, int, float]] = []  # aggregated (loss, grad, rows, busy_s)
        self.step_rows: list[dict[str, Any]] = []
        self.t_version = time.perf_counter()

    def on_start(self) -> None:
        self.t_version = time.perf_counter()  # step 0 starts when every rank is ready, not at start-up

    def _status(self) -> str:
        if self.stopped:
            return "stopped"
        return "done" if self.round.version >= self.steps else "run"

    async def pull(self, after: int) -> tuple[str, int, np.ndarray | None]:
        """Wait (one slice at most) for a version newer than `after`: (status, version, params or None)."""
        if self.round.version <= after and self._status() == "run":
            await self.wait(self.slice_s)
        if self.round.version <= after and self._status() == "run":
            return "pending", self.round.version, None
        return self._status(), self.round.version, self.w.copy()

    async def wait_past(self, version: int, timeout: float) -> int:
        """Wait up to timeout for a version newer than `version` (a backup's cue to cancel); the current one."""
        deadline = time.perf_counter() + timeout
        while self.round.version <= version and not self.stopped:
            left = deadline - time.perf_counter()
            if left <= 0:
                break
            await self.wait(left)
        return self.round.version

    async def push(
        self, rank: int, version: int, payload: np.ndarray | OneBitMessage, rows: int, loss: float, busy_s: float
    ) -> tuple[str, float, int, dict[str, Any] | None, str, int, np.ndarray | None]:
        """Deliver rank's gradient for `version` and wait (one slice at most) for the next version.

        Returns (verdict 'aggregated' | 'discarded', seconds waited here, bytes received, the step's timing row
        if this gradient completed the step, then what pull returns).
        """
        now = time.perf_counter()
        grad, nbytes = _decode(payload)
        verdict, completed = "discarded", None
        if not self.stopped:
            verdict = self.round.arrive(rank, version)
            if verdict == "aggregated":
                self.parts.append((loss, grad, rows, busy_s))
                if self.round.complete:
                    completed = self._apply(now)
        status, new_version, params = await self.pull(version)
        return verdict, time.perf_counter() - now, nbytes, completed, status, new_version, params

    async def push_packed(self, message: bytes) -> bytes:
        """push() with its arguments and its reply each pack()ed into one bytes object (the workers' hot path)."""
        return pack(*(await self.push(*unpack(message))))

    def _apply(self, now: float) -> dict[str, Any]:
        from ..sgd import averaged_gradient

        loss, grad = averaged_gradient(self.parts)
        self.w -= self.lr * grad
        log: StepLog = self.round.advance()
        self.step_rows.append(
            {
                "version": log.version,
                "step_s": now - self.t_version,
                "slowest_busy_s": max(p[3] for p in self.parts),
                "loss": loss,
                "aggregated": list(log.aggregated),
            }
        )
        self.t_version = now
        self.parts = []
        self.notify()
        return dict(self.step_rows[-1])

    async def stop_all(self) -> None:
        """Wake every waiter with status 'stopped'."""
        self.stop()

    async def report(self) -> tuple[np.ndarray, list[dict[str, Any]], list[StepLog]]:
        """Final parameters, per-step timings and the arrival logs of every step."""
        return self.w.copy(), list(self.step_rows), list(self.round.logs)


class AsyncServer(_Waitable):
    """Asynchronous SGD server: applies each gradient on arrival, measures its staleness, optionally bounds it.

    The update is chapter 03's server-side rule `optimizer` (see dsgd_teach/ps/optimizers.py: SGD, AdaGrad,
    AdaRevision, delay-compensated ASGD), given the staleness measured here; `staleness_aware` is the rule
    lr / (staleness + 1) (Zhang et al. 2015; ps.optimizers.staleness_aware_scale). `bound` (None = unbounded)
    makes readers and writers wait at StalenessGate so no gradient is staler than the bound.
    """

    def __init__(
        self, params: np.ndarray, lr: float, updates: int, bound: int | None, staleness_aware: bool,
        eval_every: int = 0, slice_s: float = 0.25, world: int = 1, optimizer: str = "sgd",
        dc_lambda: float = DEFAULT_DC_LAMBDA,
    ):
        super().__init__(world)
        self.w = np.array(params, dtype=np.float32)  # replaced at every update, never mutated
        self.lr, self.updates, self.slice_s = float(lr), updates, slice_s
        self.gate = StalenessGate(bound)
        self.staleness_aware = staleness_aware
        if staleness_aware and optimizer not in ("sgd", "staleness_aware"):
            raise ValueError(f"staleness_aware=True is the rule 'staleness_aware'; it cannot be {optimizer!r} too")
        self.rule = make_optimizer("staleness_aware" if staleness_aware else optimizer, self.w.size, dc_lambda)
        self.eval_every = eval_every

    def _status(self) -> str:
        if self.stopped:
            return "stopped"
        return "done" if self.gate.version >= self.updates else "run"

    async def pull(self, rank: int) -> tuple[str, int, np.ndarray | None]:
        """Read the parameters when the gate allows (one slice at most): (status, version, params or None)."""
        if self._status() == "run" and not self.gate.can_read(rank):
            await self.wait(self.slice_s)
        if self._status() != "run":
            return self._status(), self.gate.version, None
        if not self.gate.can_read(rank):
            return "pending", self.gate.version, None
        version = self.gate.read(rank)
        self.rule.read(version, self.w)
        return "run", version, self.w.copy()

    async def push(self, rank: int, payload: np.ndarray | OneBitMessage) -> dict[str, Any]:
        """Apply rank's gradient when the gate allows (one slice at most); returns a receipt."""
        grad, nbytes = _decode(payload)
        if self._status() == "run" and not self.gate.can_write(rank):
            await self.wait(self.slice_s)
        if self._status() != "run":
            self.gate.leave(rank)
            self.notify()
            return {"status": self._status(), "bytes": nbytes}
        if not self.gate.can_write(rank):
            return {"status": "pending", "bytes": nbytes}
        read, applied, staleness = self.gate.write(rank)
        scale = self.rule.scale(read, applied - 1)
        self.w = self.rule.apply(self.w, grad, self.lr, read, applied - 1)
        self.notify()
        snapshot = self.eval_every and (applied % self.eval_every == 0 or applied == self.updates)
        return {
            "status": "applied", "version_read": read, "version_applied": applied, "staleness": staleness,
            "scale": scale, "bytes": nbytes, "params": self.w.copy() if snapshot else None,
        }

    async def stop_all(self) -> None:
        """Wake every waiter with status 'stopped'."""
        self.stop()

    async def report(self) -> tuple[np.ndarray, int]:
        """Final parameters and version."""
        return self.w.copy(), self.gate.version
