"""The client-side view of a sharded parameter server: start the shard actors, pull, push, restore, close.

A ShardedServer pickles (only shard addresses and actor keys travel), so it can be passed into worker tasks,
which then call the shards directly, worker to worker. Every wait on a shard is bounded by timeout_s; a shard
that does not answer raises ShardUnavailable naming it. Where the shards live is also published in a dask
Variable, so a task can find a shard that the driver restored on another worker (refresh()).
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np
from distributed import Client, Variable
from distributed.actor import Actor

from ..config import check_choice, check_float, check_int, check_timeout
from ..runtime.actors import NoReply, call_each
from ..runtime.clusters.cluster import worker_addresses
from ..runtime.clusters.workers import alternate_from_end
from . import checkpoint as ckpt
from .optimizers import DEFAULT_DC_LAMBDA, OPTIMIZERS
from .shard import BarrierTimeout, ParamShard

#: Starting a shard may be a fresh worker's first task (importing torch and this package): allow for that.
START_TIMEOUT_S = 60.0
#: A waiting call looks up, this often, whether its shard was restored elsewhere meanwhile.
WAIT_SLICE_S = 0.5


class ShardUnavailable(RuntimeError):
    """A shard did not answer in time or its worker is gone."""

    def __init__(self, shard: int, address: str, reason: str) -> None:
        super().__init__(f"parameter shard {shard} on {address} is unavailable: {reason}")
        self.shard, self.address, self.reason = shard, address, reason

    @property
    def key(self) -> int:
        """What is unavailable (the shard's index): a retry reports each key once."""
        return self.shard


@dataclass(frozen=True)
class ShardInfo:
    """Where one shard lives: its slice [lo, hi), worker address, actor key and restore epoch."""

    index: int
    lo: int
    hi: int
    address: str
    key: str
    epoch: int = 0


def shard_bounds(size: int, n_shards: int) -> list[tuple[int, int]]:
    """Contiguous, nearly equal slices [lo, hi) covering range(size)."""
    return [(s * size // n_shards, (s + 1) * size // n_shards) for s in range(n_shards)]


def default_placement(addresses: list[str], n_shards: int) -> list[str]:
    """Shard s on the (n-1-s mod n)-th worker: shards fill the cluster from the end, replicas from the start."""
    addresses = alternate_from_end(addresses)  # consecutive shards on different hosts where there are several
    n = len(addresses)
    return [addresses[(n - 1 - s) % n] for s in range(n_shards)]


class ShardedServer:
    """Handle to S ParamShard actors that together hold a flat parameter vector."""

    def __init__(
        self, infos: list[ShardInfo], size: int, *, optimizer: str, lr: float, checkpoint_every: int,
        checkpoint_dir: str | None, directory: str, timeout_s: float, dc_lambda: float = DEFAULT_DC_LAMBDA,
    ) -> None:
        self.infos, self.size, self.dc_lambda = list(infos), size, float(dc_lambda)
        self.optimizer, self.lr, self.checkpoint_every = optimizer, lr, checkpoint_every
        self.checkpoint_dir, self.directory, self.timeout_s = checkpoint_dir, directory, timeout_s
        self._handles: list[Actor] | None = None
        self._client: Client | None = None  # set on the driver only
        self._futures: list[Any] = []
        self._owns_dir = False
        self._known: list[str] = []  # workers present at start (warm: preferred when restoring a shard)

    # ----------------------------------------------------------------------------------------- lifecycle
    @classmethod
    def start(
        cls, client: Client, init_params: np.ndarray, n_shards: int, optimizer: str = "sgd", lr: float = 0.1,
        checkpoint_every: int = 0, *, workers: list[str] | None = None, timeout_s: float = 10.0,
        checkpoint_dir: str | None = None, dc_lambda: float = DEFAULT_DC_LAMBDA,
    ) -> ShardedServer:
        """Start n_shards actors holding slices of init_params (placed by default_placement unless workers)."""
        init = np.asarray(init_params)
        if init.ndim != 1 or init.size == 0:
            raise ValueError(f"init_params must be a non-empty 1-D vector, got shape {init.shape}")
        init = init.astype(np.float32)
        check_int("n_shards", n_shards, 1, min(64, init.size))
        check_choice("optimizer", optimizer, OPTIMIZERS)
        check_float("lr", lr, 0.0, 100.0, lo_open=True)
        check_int("checkpoint_every", checkpoint_every, 0, 1_000_000)
        check_timeout("timeout_s", timeout_s)
        check_float("dc_lambda", dc_lambda, 0.0, 1000.0)
        addresses = worker_addresses(client)
        if not addresses:
            raise RuntimeError("the cluster has no workers to hold parameter shards")
        placement = list(workers) if workers is not None else default_placement(addresses, n_shards)
        if len(placement) != n_shards or any(a not in addresses for a in placement):
            raise ValueError(f"workers must name {n_shards} connected worker address(es), got {placement}")
        owns_dir = checkpoint_every > 0 and checkpoint_dir is None
        if owns_dir:
            checkpoint_dir = tempfile.mkdtemp(prefix="dsgd-ps-", dir=os.environ.get("DSGD_CHECKPOINT_DIR"))
        uid = uuid.uuid4().hex[:8]
        server = cls(
            [], init.size, optimizer=optimizer, lr=float(lr), checkpoint_every=checkpoint_every,
            checkpoint_dir=checkpoint_dir, directory=f"dsgd-ps-{uid}", timeout_s=float(timeout_s),
            dc_lambda=dc_lambda,
        )
        server._client, server._owns_dir, server._known = client, owns_dir, addresses
        try:
            for s, ((lo, hi), address) in enumerate(zip(shard_bounds(init.size, n_shards), placement, strict=True)):
                server._launch(ShardInfo(s, lo, hi, address, f"ps-{uid}-shard{s}-e0"), init[lo:hi], None)
            server._handles = [f.result(timeout=max(START_TIMEOUT_S, timeout_s)) for f in server._futures]
            server._publish()
        except BaseException:
            server.close()
            raise
        return server

    def _launch(self, info: ShardInfo, values: np.ndarray, restore_from: str | None) -> Any:
        """Submit one ParamShard actor pinned to info.address (never silently recreated elsewhere)."""
        file = str(ckpt.checkpoint_path(self.checkpoint_dir, info.index)) if self.checkpoint_every else None
        future = self._client.submit(
            ParamShard, info.index, info.lo, values, self.optimizer, self.lr, self.checkpoint_every, file,
            restore_from, dc_lambda=self.dc_lambda, actor=True, workers=[info.address], allow_other_workers=False, key=info.key,
            pure=False, retries=0,
        )
        if info.index < len(self.infos):
            self.infos[info.index], self._futures[info.index] = info, future
        else:
            self.infos.append(info)
            self._futures.append(future)
        return future

    def _publish(self) -> None:
        rows = [[i.index, i.lo, i.hi, i.address, i.key, i.epoch] for i in self.infos]
        Variable(self.directory, client=self._client).set(rows, timeout=self.timeout_s)

    def close(self) -> None:
        """Release the shard actors, the directory variable and (if this server made it) the checkpoint dir."""
        if self._client is not None:
            for fut in self._futures:
                fut.release()
            self._futures = []
            try:
                Variable(self.directory, client=self._client).delete()
            except Exception:  # noqa: BLE001 - the scheduler may already be gone at shutdown
                pass
        if self._owns_dir and self.checkpoint_dir:
            shutil.rmtree(self.checkpoint_dir, ignore_errors=True)
            self._owns_dir = False

    def __enter__(self) -> ShardedServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_handles=None, _client=None, _futures=[], _owns_dir=False)
        return state

    # ------------------------------------------------------------------------------------ data path
    @property
    def n_shards(self) -> int:
        return len(self.infos)

    @property
    def handles(self) -> list[Actor]:
        if self._handles is None:
            self._handles = [Actor(ParamShard, i.address, i.key) for i in self.infos]
        return self._handles

    def _moved(self, info: ShardInfo) -> bool:
        """True when the directory says the shard now lives somewhere else (it was restored)."""
        if self._client is not None:
            return False  # the driver restores shards itself; it never waits on a stale handle
        try:
            rows = Variable(self.directory).get(timeout=self.timeout_s)
        except Exception:  # noqa: BLE001 - an unreadable directory is treated as "not moved"
            return False
        return ShardInfo(*rows[info.index]) != info

    def _call(self, method: str, per_shard_args: list[tuple], what: str, timeout: float | None = None) -> list[Any]:
        """One call to every shard (the runtime's call_each): a shard that does not answer is ShardUnavailable."""
        total = self.timeout_s if timeout is None else timeout
        try:
            return call_each(self.handles, method, per_shard_args, total, WAIT_SLICE_S,
                             moved=lambda i: self._moved(self.infos[i]), passthrough=(ValueError, BarrierTimeout))
        except NoReply as exc:
            info = self.infos[exc.index]
            raise ShardUnavailable(info.index, info.address, f"{what}: {exc.reason}") from exc.__cause__

    def pull(
        self, min_versions: list[int] | None = None, wait_s: float | None = None, *, timeout: float | None = None
    ) -> tuple[np.ndarray, list[int]]:
        """The full flat parameter vector and each shard's version (optionally waiting for min_versions)."""
        if min_versions is None:
            parts = self._call("get", [() for _ in self.infos], "pull", timeout)
        else:
            wait = self.timeout_s if wait_s is None else wait_s
            args = [(int(v), wait) for v in min_versions]
            parts = self._call("get", args, "pull", timeout=wait + self.timeout_s)
        params = parts[0][0] if len(parts) == 1 else np.concatenate([p[0] for p in parts])
        return params, [int(p[1]) for p in parts]

    def _slices(self, grad: np.ndarray, versions_read: list[int]) -> list[np.ndarray]:
        grad = np.asarray(grad, dtype=np.float32)
        if grad.shape != (self.size,):
            raise ValueError(f"gradient must have shape ({self.size},), got {grad.shape}")
        if len(versions_read) != self.n_shards:
            raise ValueError(f"versions_read must have {self.n_shards} entries, got {len(versions_read)}")
        return [grad[i.lo : i.hi] for i in self.infos]

    def push(self, key: tuple[int, int], grad: np.ndarray, versions_read: list[int], scale: float = 1.0) -> list[dict]:
        """Apply lr*scale*grad, slice by slice, on every shard; returns one receipt per shard (idempotent by key)."""
        if not (isinstance(scale, (int, float)) and math.isfinite(scale)):
            raise ValueError(f"scale must be a finite number, got {scale!r}")
        slices = self._slices(grad, versions_read)
        args = [(tuple(key), g, int(v), float(scale)) for g, v in zip(slices, versions_read, strict=True)]
        return self._call("push", args, f"push {tuple(key)}")

    def push_pull(
        self, key: tuple[int, int], grad: np.ndarray, versions_read: list[int], scale: float = 1.0
    ) -> tuple[list[dict], np.ndarray, list[int]]:
        """push() then pull() with one call per shard: (receipts, params after the push, versions)."""
        if not (isinstance(scale, (int, float)) and math.isfinite(scale)):
            raise ValueError(f"scale must be a finite number, got {scale!r}")
        slices = self._slices(grad, versions_read)
        args = [(tuple(key), g, int(v), float(scale)) for g, v in zip(slices, versions_read, strict=True)]
        parts = self._call("push_get", args, f"push_pull {tuple(key)}")
        params = parts[0][1] if len(parts) == 1 else np.concatenate([p[1] for p in parts])
        return [p[0] for p in parts], params, [int(p[2]) for p in parts]

    def push_sync(self, key: tuple[int, int], grad: np.ndarray, versions_read: list[int], n_expected: int) -> list[dict]:
        """Contribute grad to the current synchronous round; the shard applies the mean once n_expected arrived."""
        slices = self._slices(grad, versions_read)
        args = [(tuple(key), g, int(v), int(n_expected)) for g, v in zip(slices, versions_read, strict=True)]
        return self._call("push_sync", args, f"push {tuple(key)}")

    def stats(self) -> list[dict[str, Any]]:
        """Per-shard counters (pushes, duplicates, pulls, bytes in/out, version, checkpoint_version)."""
        return self._call("stats_dict", [() for _ in self.infos], "stats")

    def ping(self, timeout: float | None = None) -> list[int]:
        """Each shard's version: one bare actor call per shard."""
        return self._call("ping", [() for _ in self.infos], "ping", timeout)

    # ------------------------------------------------------------------------------------ fault handling
    def refresh(self) -> list[int]:
        """Re-read where the shards live (after a restore); returns the shards whose placement changed."""
        rows = Variable(self.directory).get(timeout=self.timeout_s)
        changed = []
        for row in rows:
            info = ShardInfo(*row)
            if info != self.infos[info.index]:
                self.infos[info.index] = info
                changed.append(info.index)
        if changed:
            self._handles = None
        return changed

    def lost_shards(self) -> list[int]:
        """Shards whose worker has left the cluster (driver only)."""
        alive = set(worker_addresses(self._client))
        return [i.index for i in self.infos if i.address not in alive]

    def restore(self, shard: int) -> dict[str, Any]:
        """Recreate a lost shard on a live worker from its last checkpoint (driver only); says what came back.

        Raises ShardUnavailable naming the shard when it cannot be done (no checkpoints, or no worker left).
        """
        old = self.infos[shard]
        if not self.checkpoint_every:
            raise ShardUnavailable(shard, old.address, "its worker died and checkpointing is off (checkpoint_every=0)")
        path = ckpt.checkpoint_path(self.checkpoint_dir, shard)
        if not path.exists():
            raise ShardUnavailable(shard, old.address, f"its worker died and there is no checkpoint at {path}")
        alive = worker_addresses(self._client)
        if not alive:
            raise ShardUnavailable(shard, old.address, "its worker died and no worker is left to restore it on")
        self._futures[shard].release()
        warm = [a for a in alive if a in self._known] or alive  # a restarted worker has yet to import torch
        address = default_placement(warm, self.n_shards)[shard]
        info = ShardInfo(shard, old.lo, old.hi, address, f"{old.key.rsplit('-e', 1)[0]}-e{old.epoch + 1}", old.epoch + 1)
        future = self._launch(info, np.zeros(0, np.float32), str(path))
        try:
            handle = future.result(timeout=max(START_TIMEOUT_S, self.timeout_s))
        except Exception as exc:
            raise ShardUnavailable(shard, address, f"restoring from {path} failed: {type(exc).__name__}: {exc}") from exc
        handles = self.handles
        handles[shard] = handle
        self._publish()
        version = int(handle.ping().result(timeout=self.timeout_s))
        return {"shard": shard, "old_address": old.address, "new_address": address, "epoch": info.epoch,
                "checkpoint_version": version}
