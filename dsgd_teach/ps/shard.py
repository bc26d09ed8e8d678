"""One parameter-server shard: a dask Actor holding a slice of the flat parameters and a version counter.

Methods are coroutines, so dask runs them on the worker's event loop: no thread hop per call, and no two methods
of a shard ever interleave inside an update. Every update replaces the values array instead of mutating it,
so a reader's array is never changed underneath it (and get() needs no copy).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np

from . import checkpoint as ckpt
from .optimizers import DEFAULT_DC_LAMBDA, make_optimizer


class BarrierTimeout(RuntimeError):
    """A synchronous round did not complete in time: some replica never pushed its gradient."""


class ParamShard:
    """Slice [lo, hi) of the parameter vector, updated by pushed gradients with a server-side rule."""

    def __init__(
        self,
        index: int,
        lo: int,
        values: np.ndarray,
        optimizer: str = "sgd",
        lr: float = 0.1,
        checkpoint_every: int = 0,
        checkpoint_file: str | None = None,
        restore_from: str | None = None,
        dc_lambda: float = DEFAULT_DC_LAMBDA,
    ) -> None:
        self.index, self.lo, self.lr = index, lo, float(lr)
        self.optimizer = make_optimizer(optimizer, len(values), dc_lambda)
        self.values = np.asarray(values, dtype=np.float32).copy()
        self.version = 0
        self.applied: set[tuple[int, int]] = set()
        self.checkpoint_every, self.checkpoint_file = checkpoint_every, checkpoint_file
        self.checkpoint_version = 0
        self.stats: dict[str, int] = {"pushes": 0, "duplicates": 0, "pulls": 0, "bytes_in": 0, "bytes_out": 0}
        if restore_from is not None:
            state = ckpt.load(restore_from)
            self.values, self.version, self.applied = state.values, state.version, state.applied
            self.optimizer.load_state(state.optimizer_state)
            self.checkpoint_version = state.version
        elif checkpoint_every and checkpoint_file:
            ckpt.save(checkpoint_file, ckpt.ShardState(self.values, 0, set(), self.optimizer.state()))
        # Synchronous mode: gradients for the current version wait here until all replicas have pushed.
        self._pending: dict[tuple[int, int], np.ndarray] = {}
        self._changed = asyncio.Condition()

    async def get(self, min_version: int = 0, timeout: float = 10.0) -> tuple[np.ndarray, int]:
        """(values, version), waiting up to timeout seconds for version >= min_version (synchronous mode)."""
        if self.version < min_version:
            try:
                async with self._changed:
                    await asyncio.wait_for(self._changed.wait_for(lambda: self.version >= min_version), timeout)
            except (asyncio.TimeoutError, TimeoutError):
                raise BarrierTimeout(
                    f"shard {self.index} stayed at version {self.version} for {timeout:.1f} s waiting for "
                    f"{min_version}: not every replica pushed (one may have died)"
                ) from None
        self.stats["pulls"] += 1
        self.stats["bytes_out"] += self.values.nbytes
        self.optimizer.read(self.version, self.values)  # delay-aware rules remember what this reader saw
        return self.values, self.version

    async def push(self, key: tuple[int, int], grad: np.ndarray, version_read: int, scale: float = 1.0) -> dict[str, Any]:
        """Apply lr*scale*grad now (asynchronous mode), unless key was applied before; returns a receipt."""
        key = (int(key[0]), int(key[1]))
        receipt = self._receipt(key, grad, version_read)
        if receipt["applied"]:
            self.applied.add(key)
            await self._update(grad, self.lr * scale, version_read)
            receipt["version_applied"] = self.version
            receipt["staleness"] = self.version - 1 - version_read
        return receipt

    async def push_get(
        self, key: tuple[int, int], grad: np.ndarray, version_read: int, scale: float = 1.0
    ) -> tuple[dict[str, Any], np.ndarray, int]:
        """push() and then get() in one round trip: Downpour's push followed at once by its next fetch."""
        receipt = await self.push(key, grad, version_read, scale)
        values, version = await self.get()
        return receipt, values, version

    async def push_sync(
        self, key: tuple[int, int], grad: np.ndarray, version_read: int, n_expected: int, scale: float = 1.0
    ) -> dict[str, Any]:
        """Add grad to the current round (synchronous mode); the last of n_expected pushes applies their mean."""
        key = (int(key[0]), int(key[1]))
        if key not in self.applied and key not in self._pending and version_read != self.version:
            raise ValueError(
                f"shard {self.index}: synchronous push {key} read version {version_read}, the shard is at "
                f"{self.version} (a replica skipped the barrier)"
            )
        receipt = self._receipt(key, grad, version_read)
        receipt["applied"] = receipt["applied"] and key not in self._pending
        if receipt["applied"]:
            self._pending[key] = grad
            receipt["version_applied"] = self.version + 1
            if len(self._pending) >= n_expected:
                grads = [self._pending[k] for k in sorted(self._pending)]
                mean = np.sum(grads, axis=0, dtype=np.float32) / np.float32(len(grads))
                self.applied.update(self._pending)
                self._pending = {}
                await self._update(mean, self.lr * scale)
        return receipt

    async def stats_dict(self) -> dict[str, Any]:
        """Counters for the per-shard traffic plot, with the version and the last checkpointed version."""
        return {
            "shard": self.index, "version": self.version, "checkpoint_version": self.checkpoint_version,
            "size": int(self.values.size), **self.stats,
        }

    async def ping(self) -> int:
        """The current version (a cheap liveness check and the reference actor call for benchmarks)."""
        return self.version

    def _receipt(self, key: tuple[int, int], grad: np.ndarray, version_read: int) -> dict[str, Any]:
        if grad.shape != self.values.shape:
            raise ValueError(f"shard {self.index}: gradient slice has shape {grad.shape}, expected {self.values.shape}")
        applied = key not in self.applied
        self.stats["pushes" if applied else "duplicates"] += 1
        self.stats["bytes_in"] += grad.nbytes
        return {
            "shard": self.index, "applied": applied, "version_read": int(version_read),
            "version_applied": self.version, "staleness": 0, "bytes": int(grad.nbytes), "server_time": time.time(),
        }

    async def _update(self, grad: np.ndarray, step: float, version_read: int | None = None) -> None:
        self.values = self.optimizer.apply(self.values, grad, step, version_read, self.version)
        self.version += 1
        if self.checkpoint_every and self.checkpoint_file and self.version % self.checkpoint_every == 0:
            state = ckpt.ShardState(self.values, self.version, set(self.applied), self.optimizer.state())
            ckpt.save(self.checkpoint_file, state)
            self.checkpoint_version = self.version
        async with self._changed:
            self._changed.notify_all()
