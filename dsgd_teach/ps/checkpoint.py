"""Shard checkpoints: the shard's values, version, optimizer state and applied push keys, written atomically.

A checkpoint is a .npz file in a directory every worker and the driver can read (a local temp dir on one
machine; on a real cluster it must be shared storage, as DistBelief's and TensorFlow's checkpoints are).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


@dataclass
class ShardState:
    """Everything a shard needs to resume: what a checkpoint holds."""

    values: np.ndarray
    version: int
    applied: set[tuple[int, int]] = field(default_factory=set)
    optimizer_state: dict[str, np.ndarray] = field(default_factory=dict)


def checkpoint_path(directory: str | Path, shard: int) -> Path:
    """Where shard's checkpoint lives inside directory."""
    return Path(directory) / f"shard{shard}.npz"


def save(path: str | Path, state: ShardState) -> int:
    """Write state to path atomically (temp file + rename, so a crash never leaves half a file); returns bytes."""
    path = Path(path)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    keys = np.array(sorted(state.applied), dtype=np.int64).reshape(-1, 2)
    opt = {f"opt_{k}": v for k, v in state.optimizer_state.items()}
    with open(tmp, "wb") as fh:
        np.savez(fh, values=state.values, version=np.int64(state.version), applied=keys, **opt)
    os.replace(tmp, path)
    return path.stat().st_size


def load(path: str | Path) -> ShardState:
    """Read a checkpoint written by save()."""
    with np.load(Path(path)) as z:
        applied = {(int(a), int(b)) for a, b in z["applied"]}
        opt = {k[4:]: z[k].copy() for k in z.files if k.startswith("opt_")}
        return ShardState(z["values"].copy(), int(z["version"]), applied, opt)
