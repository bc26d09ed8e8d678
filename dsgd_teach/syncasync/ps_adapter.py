"""Chapter 03's sharded parameter server answering the calls this chapter's async loop makes of AsyncServer."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..ps import ShardedServer
from ..ps.optimizers import staleness_aware_scale


class PsAsAsyncServer:
    """pull(rank) and push(rank, grad) over a ShardedServer: no staleness gate, every rule of chapter 03.

    Reads stop ("done") once `updates` gradients have landed; a push whose update reaches a multiple of
    eval_every (or the last update) carries the parameters after it, as AsyncServer's receipts do.
    """

    def __init__(self, server: ShardedServer, updates: int, eval_every: int, staleness_aware: bool) -> None:
        self.server, self.updates, self.eval_every = server, updates, eval_every
        self.staleness_aware = staleness_aware
        self._read: dict[int, list[int]] = {}
        self._pushes: dict[int, int] = {}

    def join(self, rank: int) -> str:
        """No start barrier: the shards serve whoever comes."""
        return "run"

    def pull(self, rank: int) -> tuple[str, int, np.ndarray | None]:
        """(status, version, params): 'done' once `updates` gradients have been applied."""
        w, versions = self.server.pull()
        if versions[0] >= self.updates:
            return "done", versions[0], None
        self._read[rank] = versions
        return "run", versions[0], w

    def push(self, rank: int, grad: np.ndarray) -> dict[str, Any]:
        """Push rank's gradient (keyed by rank and its push count, so a retry is not applied twice)."""
        versions = self._read[rank]
        k = self._pushes.get(rank, 0)
        self._pushes[rank] = k + 1
        receipts = self.server.push((rank, k), grad, versions)
        applied = max(r["version_applied"] for r in receipts)
        tau = max(r["staleness"] for r in receipts)
        snapshot = self.eval_every and (applied % self.eval_every == 0 or applied == self.updates)
        return {
            "status": "applied", "version_read": versions[0], "version_applied": applied, "staleness": tau,
            "scale": staleness_aware_scale(tau) if self.staleness_aware else 1.0, "bytes": sum(r["bytes"] for r in receipts),
            "params": self.server.pull()[0] if snapshot else None,
        }

    def stop_all(self) -> None:
        """Nothing waits at the shards, so there is nobody to wake."""
