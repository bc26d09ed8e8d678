"""The shared parameter block: named numpy arrays in one `multiprocessing.shared_memory` segment, plus a mutex.

The driver creates the block and *always* unlinks it (a context manager with a finally), also when a run is
stopped or a worker dies; if the driver process itself dies, its resource tracker unlinks it. Workers attach
without registering the block with a resource tracker, so no process ever unlinks it twice or warns about it.
"""

from __future__ import annotations

import glob
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing import resource_tracker
from multiprocessing.shared_memory import SharedMemory

import numpy as np

from .mutex import MUTEX_BYTES, destroy_mutex, init_mutex

#: Every block this chapter creates is named PREFIX + creator's pid + "_" + a random tag (/dev/shm/dsgd_hw_* on Linux).
PREFIX = "dsgd_hw_"
_ALIGN = 64  # one cache line: arrays never share a line with the mutex or with each other


@dataclass(frozen=True)
class BlockSpec:
    """Name and layout of a block: (field, dtype, length) per array; picklable, so workers can attach."""

    name: str
    arrays: tuple[tuple[str, str, int], ...]

    def layout(self) -> dict[str, tuple[int, np.dtype, int]]:
        """Byte offset, dtype and length of each array (after the mutex, each on its own cache line)."""
        out, offset = {}, MUTEX_BYTES
        for field, dtype, length in self.arrays:
            dt = np.dtype(dtype)
            out[field] = (offset, dt, length)
            offset += -(-max(1, length * dt.itemsize) // _ALIGN) * _ALIGN
        return out

    @property
    def nbytes(self) -> int:
        """Total size of the segment."""
        end = MUTEX_BYTES + _ALIGN
        for offset, dt, length in self.layout().values():
            end = max(end, offset + length * dt.itemsize)
        return end


class SharedBlock:
    """An open mapping of a block: `block[field]` is a numpy view, `mutex_address` is for the kernels."""

    def __init__(self, shm: SharedMemory, spec: BlockSpec) -> None:
        self.shm, self.spec = shm, spec
        raw = np.frombuffer(shm.buf, dtype=np.uint8, count=spec.nbytes)
        self.mutex_address = int(raw.ctypes.data)
        self._views: dict[str, np.ndarray] | None = {
            field: raw[off : off + length * dt.itemsize].view(dt) for field, (off, dt, length) in spec.layout().items()
        }
        del raw

    def __getitem__(self, field: str) -> np.ndarray:
        if self._views is None:
            raise RuntimeError(f"shared block {self.spec.name} is closed")
        return self._views[field]

    def close(self) -> None:
        """Drop the views and unmap (callers must not keep views of their own past this point)."""
        self._views = None
        try:
            self.shm.close()
        except BufferError:  # someone still holds a view; the mapping goes when it is garbage-collected
            pass


@contextmanager
def create_block(arrays: list[tuple[str, str, int]]) -> Iterator[SharedBlock]:
    """Create a zeroed block with an initialised mutex; on exit, close and unlink it whatever happened."""
    spec = BlockSpec(f"{PREFIX}{os.getpid()}_{uuid.uuid4().hex[:12]}", tuple(arrays))
    shm = SharedMemory(name=spec.name, create=True, size=spec.nbytes)
    block = None
    try:
        block = SharedBlock(shm, spec)
        init_mutex(block.mutex_address)
        yield block
    finally:
        if block is not None:
            destroy_mutex(block.mutex_address)
            block.close()
        else:
            shm.close()
        shm.unlink()


_register_lock = threading.Lock()


def _open_untracked(name: str) -> SharedMemory:
    """Attach to an existing segment without telling a resource tracker (only its creator may unlink it)."""
    if sys.version_info >= (3, 13):
        return SharedMemory(name=name, track=False)
    # Python <= 3.12 registers on attach too (CPython issue #82300); skip that one registration.
    with _register_lock:
        original = resource_tracker.register

        def register(rname: str, rtype: str) -> None:
            if rtype != "shared_memory":
                original(rname, rtype)

        resource_tracker.register = register
        try:
            return SharedMemory(name=name)
        finally:
            resource_tracker.register = original


@contextmanager
def attach_block(spec: BlockSpec) -> Iterator[SharedBlock]:
    """Map an existing block in this (worker) process; unmaps on exit, never unlinks."""
    try:
        shm = _open_untracked(spec.name)
    except FileNotFoundError:
        raise RuntimeError(f"shared block {spec.name} no longer exists (the run was stopped or ended)") from None
    block = SharedBlock(shm, spec)
    try:
        yield block
    finally:
        block.close()


def leftover_blocks(creator: int | None = None) -> list[str]:
    """Names of this chapter's blocks in /dev/shm, only those process `creator` made if given (empty without /dev/shm)."""
    pattern = PREFIX + ("*" if creator is None else f"{creator}_*")
    return sorted(os.path.basename(p) for p in glob.glob(os.path.join("/dev/shm", pattern)))


BARRIER_TIMEOUT_S = 120.0


def barrier(ready: np.ndarray, rank: int, should_stop: Callable[[], bool]) -> bool:
    """Mark this rank ready and wait for all (each rank writes only its own slot: no race); False if stopped."""
    ready[rank] = 1
    deadline = time.monotonic() + BARRIER_TIMEOUT_S
    while not np.all(ready == 1):
        if should_stop():
            return False
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"rank {rank}: not every worker arrived within {BARRIER_TIMEOUT_S:.0f} s (are there more ranks "
                "than dask worker processes?)"
            )
        time.sleep(0.0005)  # polling for the other ranks, not work
    return True
