"""The course's worker settings, applied through one dask WorkerPlugin, `CourseSettings`.

Registered with `Client.register_plugin`, it sets them in every worker, including ones that join later: torch's
intra-op threads (by host, or one count for all), and, for workers of a deployment the course did not start (whose
processes are already running), glibc's malloc thresholds through mallopt (what cluster.WORKER_MALLOC sets by
environment for the workers the course spawns) and the imports the experiments need. Unregistering it (the
client's close does) restores torch's thread count.
"""

from __future__ import annotations

import ctypes
import importlib
import sys
from typing import Any

from distributed import Client
from distributed.diagnostics.plugin import WorkerPlugin

from ...machine import WORKER_MALLOC, cpu_count, host_of, machine_id

PLUGIN_NAME = "dsgd-course-settings"
#: glibc mallopt parameter numbers (malloc.h).
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
IMPORTS = ("numpy", "torch", "dsgd_teach")


def set_malloc(mmap_threshold: int, trim_threshold: int) -> bool:
    """Apply glibc's mmap and trim thresholds in this process; False where there is no glibc."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    ok_mmap = libc.mallopt(M_MMAP_THRESHOLD, int(mmap_threshold))
    ok_trim = libc.mallopt(M_TRIM_THRESHOLD, int(trim_threshold))
    return bool(ok_mmap and ok_trim)


def release_free_memory() -> bool:
    """Give the pages malloc holds free back to the system (glibc's malloc_trim), as a rank ends or a run returns;
    False where there is no glibc. Freed tensors leave holes below the heap's top that the trim threshold never
    reaches: chapter 10's workers each held up to 140 MiB of them after the full-mode runs."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return bool(ctypes.CDLL("libc.so.6").malloc_trim(0))
    except (OSError, AttributeError):
        return False


class CourseSettings(WorkerPlugin):
    """Torch threads per worker (by host, else `threads`), and where given malloc thresholds and imports."""

    idempotent = False

    def __init__(self, threads_by_host: dict[str, int] | None = None, malloc: dict[str, int] | None = None,
                 imports: tuple[str, ...] = (), threads: int = 1) -> None:
        self.threads_by_host = dict(threads_by_host or {})
        self.threads = threads
        self.malloc = dict(malloc or {})
        self.imports = tuple(imports)
        self._previous_threads: int | None = None

    def setup(self, worker: Any) -> None:  # dask's signature
        """Called once in each worker (now and when one joins later)."""
        for name in self.imports:
            importlib.import_module(name)
        import torch

        self._previous_threads = torch.get_num_threads()
        torch.set_num_threads(self.threads_by_host.get(host_of(worker.address), self.threads))
        if self.malloc:
            set_malloc(self.malloc["MALLOC_MMAP_THRESHOLD_"], self.malloc["MALLOC_TRIM_THRESHOLD_"])

    def teardown(self, worker: Any) -> None:  # dask's signature
        """Called when the plugin is unregistered or the worker closes: give torch its thread count back."""
        if self._previous_threads is not None:
            import torch

            torch.set_num_threads(self._previous_threads)


def _machine_cores() -> tuple[str, int]:
    """(this machine's identity, its cores): the kernel's boot id, shared by every network namespace on it."""
    return machine_id(), cpu_count()


def threads_by_host(client: Client) -> dict[str, int]:
    """floor(cores of the machine / workers on that machine), at least 1, for every worker address's host.

    Workers are counted per machine, not per address: emulated hosts (dsgd_teach.runtime.clusters.hosts) give each worker its own
    address on one machine, and giving each of them all the machine's cores oversubscribes it (measured: torch's
    spinning intra-op threads made each step of a ring allreduce over four such hosts several times slower).
    """
    cores = client.run(_machine_cores)  # {address: (machine, cores)}
    per_machine: dict[str, list[int]] = {}
    for machine, n in cores.values():
        per_machine.setdefault(machine, []).append(n)
    share = {m: max(1, min(ns) // len(ns)) for m, ns in per_machine.items()}
    out: dict[str, int] = {}
    for address, (machine, _) in cores.items():
        host = host_of(address)
        out[host] = min(out.get(host, share[machine]), share[machine])
    return out


def apply(client: Client) -> str:
    """Register CourseSettings on every current and future worker; returns a one-line description."""
    threads = threads_by_host(client)
    client.register_plugin(CourseSettings(threads, WORKER_MALLOC, IMPORTS), name=PLUGIN_NAME)
    shown = ", ".join(f"{h}: {t}" for h, t in sorted(threads.items()))
    return f"course worker settings applied (torch threads per worker by host: {shown or 'no workers yet'})"


def remove(client: Client) -> None:
    """Unregister CourseSettings (each worker's teardown restores torch's thread count)."""
    client.unregister_worker_plugin(PLUGIN_NAME)
