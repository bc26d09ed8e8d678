"""A sandbox cgroup's socket-memory bound and I/O weight, where this host's kernel offers them (see cgroups.py).

Socket buffers: every TCP socket on the host draws on one pool (`net.ipv4.tcp_mem`); past its pressure threshold
the kernel shrinks every socket's buffers, the grader's and its workers' included. Each sandbox may hold at most
`socket_budget(jobs)`, 90 % of that threshold divided by the sandboxes graded at once: on cgroup v1 through
`memory.kmem.tcp.limit_in_bytes` (its sockets then stall at that bound; `max_usage_in_bytes` shows it was
reached); on cgroup v2 socket buffers are charged to the sandbox's `memory.max` and the kernel has no separate
knob, so there the bound is the memory limit, and the README's sizing rule says how to keep it below.

I/O: every sandbox gets the same weight, `io.weight` (v2, with the io controller) or `blkio.weight` /
`blkio.bfq.weight` (v1), as it gets the same CPU weight. A weight only acts where a device's scheduler honours it
(BFQ, or blk-iocost on v2); where no weight file exists, `io_parent` says why and the batch records it in
grading.json. A sandbox writes to nothing but its RAM-backed /tmp, so its disk I/O is reading the shared,
read-only installation.
"""

from __future__ import annotations

import os
import resource

IO_WEIGHT = 100
V1_IO_FILES = ("blkio.weight", "blkio.bfq.weight")
V2_IO_FILES = ("io.weight", "io.bfq.weight")
TCP_LIMIT = "memory.kmem.tcp.limit_in_bytes"


def tcp_pressure_bytes(path: str = "/proc/sys/net/ipv4/tcp_mem") -> int:
    """The host's TCP memory pressure threshold in bytes (tcp_mem's middle value, in pages); 0 if unknown."""
    try:
        with open(path) as fh:
            pages = int(fh.read().split()[1])
    except (OSError, ValueError, IndexError):
        return 0
    return pages * resource.getpagesize()


def socket_budget(jobs: int, memory_bytes: int) -> int:
    """What one of `jobs` sandboxes may hold in socket buffers: 90 % of the pressure threshold / jobs (<= memory)."""
    pressure = tcp_pressure_bytes()
    if not pressure:
        return memory_bytes
    return min(memory_bytes, pressure * 9 // 10 // max(1, jobs))


def set_socket_limit(memory_dir: str, version: int, socket_bytes: int) -> None:
    """v1: write the sandbox's TCP buffer limit (nothing to write on v2, where memory.max covers sockets)."""
    path = os.path.join(memory_dir, TCP_LIMIT)
    if version == 1 and socket_bytes and os.path.exists(path):
        with open(path, "w") as fh:
            fh.write(str(socket_bytes))


def socket_peak(memory_dir: str, version: int) -> int:
    """The most the sandbox's sockets held at once under the v1 TCP limit (0 on v2 or without the file)."""
    if version != 1:
        return 0
    try:
        with open(os.path.join(memory_dir, "memory.kmem.tcp.max_usage_in_bytes")) as fh:
            return int(fh.read().strip() or 0)
    except (OSError, ValueError):
        return 0


def socket_rule(version: int, memory_dir: str | None) -> str:
    """How socket memory is bounded per sandbox here, in words (for grading.json)."""
    if version == 1 and memory_dir and os.path.exists(os.path.join(memory_dir, TCP_LIMIT)):
        return f"{TCP_LIMIT} per sandbox"
    if version == 2:
        return "charged to the sandbox's memory.max (cgroup v2 has no separate socket limit)"
    return "not bounded per sandbox (no memory cgroup with a TCP limit)"


def set_io_weight(d: str, version: int) -> bool:
    """Give cgroup d the common I/O weight; False where this hierarchy has no weight file."""
    written = False
    for name in V2_IO_FILES if version == 2 else V1_IO_FILES:
        path = os.path.join(d, name)
        if os.path.exists(path):
            try:
                with open(path, "w") as fh:
                    fh.write(f"default {IO_WEIGHT}" if version == 2 else str(IO_WEIGHT))
                written = True
            except OSError:
                pass
    return written


def io_parent(version: int, parent: str, blkio_mount: str | None, own_blkio: str) -> tuple[str | None, str]:
    """Where a sandbox's I/O weight can be set: (v1 blkio parent or None, why not when there is none)."""
    if version == 2:
        return None, "" if _v2_io_enabled(parent) else "cgroup v2: the io controller cannot be enabled here"
    if not blkio_mount:
        return None, "cgroup v1: no blkio hierarchy"
    base = os.path.join(blkio_mount, own_blkio.lstrip("/"))
    if not any(os.path.exists(os.path.join(base, n)) for n in V1_IO_FILES):
        return None, ("cgroup v1 blkio has no proportional weight here (the block devices' schedulers offer none; "
                      "only BFQ does)")
    if not os.access(base, os.W_OK):
        return None, f"cgroup v1: {base} is not writable"
    return base, ""


def _v2_io_enabled(parent: str) -> bool:
    """Enable the io controller for parent's children (True when it is, or already was)."""
    try:
        with open(os.path.join(parent, "cgroup.controllers")) as fh:
            if "io" not in fh.read().split():
                return False
        with open(os.path.join(parent, "cgroup.subtree_control"), "w") as fh:
            fh.write("+io")
        return True
    except OSError:
        return False
