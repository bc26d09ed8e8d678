"""The machine and the scheduler's view of it: cores, worker addresses and their hosts, the largest cluster.

The lowest layer of the cluster code: cluster.py (starting and resizing), workers.py (getting N workers) and
worker_settings.py (what every worker process sets up) all build on it and never on each other's internals.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlparse

from distributed import Client

from .memory import scheduler_workers

#: The most workers any run, cluster or panel of the course asks for.
MAX_WORKERS = 64

#: glibc malloc settings for worker processes. dask's default (trim at 64 KiB) also freezes the mmap threshold at
#: 128 KiB, so every array of a megabyte is a fresh mmap whose pages fault in one by one: about 0.7 ms per
#: 1 MB parameter-server update here. Arrays up to 16 MiB come from the reusable heap instead, and at most
#: 32 MiB of freed memory is kept back per process.
WORKER_MALLOC = {"MALLOC_MMAP_THRESHOLD_": 16 * 2**20, "MALLOC_TRIM_THRESHOLD_": 32 * 2**20}


def cpu_count() -> int:
    """Cores this process may use (respects affinity masks and containers)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def machine_id() -> str:
    """This machine's identity: the kernel's boot id, shared by every process and network namespace on it."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return os.uname().nodename


def check_n_workers(name: str, value: object) -> int:
    """value as a worker count in [1, MAX_WORKERS], else ValueError naming the field and the range."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_WORKERS:
        raise ValueError(f"{name} must be an integer in [1, {MAX_WORKERS}], got {value!r}")
    return value


def worker_addresses(client: Client) -> list[str]:
    """Addresses of all connected workers, sorted (rank r runs on the r-th address)."""
    # Ask the scheduler directly: scheduler_info() returns the client's cached identity, which a background
    # callback refreshes without per-worker entries, so under load it can come back with no workers at all.
    return sorted(scheduler_workers(client))


def host_of(address: str) -> str:
    """The host part of a worker address such as tcp://10.0.0.5:40123."""
    return urlparse(address).hostname or address
