"""Worker memory: what a worker holds after its imports, the limit that leaves it room, and a clear error instead
of a hang when a worker cannot fit.

dask pauses a worker whose resident memory passes a fraction of its limit (`distributed.worker.memory.pause`,
80 % by default): a paused worker starts no new task, so a run waiting on it would wait for ever. What a worker
holds before it does anything depends on the torch build installed. Importing PyPI's standard Linux wheel (a CUDA
build) leaves about 700 MiB resident even without a GPU, the CPU-only wheel about 280 MiB. So the limit is planned
from a measured baseline: a fresh interpreter imports what a worker imports, its resident memory is read, and the
figure is cached per environment. Every run checks its workers first and raises WorkerMemoryError, naming the
figures and what to do, where a worker is paused or cannot fit.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib import metadata, util
from pathlib import Path
from typing import Any

import dask
import psutil

MiB = 1024**2
#: Kernel plus cluster should stay within mybinder.org's 2 GiB where the machine has no more than that.
BINDER_BUDGET_BYTES = 2 * 1024**3
#: What a chapter's model, data, messages and first tasks add above a worker's imports (the CPU wheel's workers
#: ran every chapter with 281 MiB of imports under a 614 MiB pause threshold: 333 MiB of room).
WORKING_ROOM_BYTES = 336 * MiB
#: Used only when the baseline cannot be measured: resident memory after the imports, by torch build.
ESTIMATED_BASELINE_BYTES = {"cpu": 300 * MiB, "cuda": 740 * MiB}
#: What a worker imports before its first task (the course's worker plugins import torch and dsgd_teach).
WORKER_IMPORTS = ("distributed", "numpy", "torch", "dsgd_teach")
CPU_WHEEL_HINT = (
    "install the CPU-only torch wheel (pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu, "
    "about 280 MiB per worker instead of about 700 MiB)"
)


class WorkerMemoryError(RuntimeError):
    """A worker the run needs is paused by dask's memory monitor, or could not hold its imports."""


@dataclass(frozen=True)
class MemoryPlan:
    """Per-worker memory limit for n workers on this machine, with the figures it came from."""

    limit: int
    baseline: int
    machine: int
    pause_fraction: float
    build: str

    @property
    def headroom(self) -> int:
        """Bytes a worker may add above its baseline before dask pauses it."""
        return int(self.limit * self.pause_fraction) - self.baseline


def torch_build() -> str:
    """'cuda' when the installed torch carries CUDA libraries (PyPI's standard Linux wheel), else 'cpu'."""
    spec = util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return "cpu"
    lib = Path(next(iter(spec.submodule_search_locations))) / "lib"
    return "cuda" if any(lib.glob("libtorch_cuda*")) or any(lib.glob("libc10_cuda*")) else "cpu"


def machine_memory() -> int:
    """Bytes this process may use: physical memory, or a cgroup's limit where one is lower (Binder, containers)."""
    total = psutil.virtual_memory().total
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total


def pause_fraction() -> float:
    """The fraction of its limit at which dask pauses a worker (1.0 where pausing is switched off)."""
    value = dask.config.get("distributed.worker.memory.pause", 0.8)
    return float(value) if value else 1.0


def _fingerprint() -> str:
    """What the baseline depends on: this interpreter and the versions of the packages a worker imports."""
    parts = [sys.executable, sys.version, torch_build()]
    for name in ("torch", "distributed", "numpy", "dsgd-teach"):
        try:
            parts.append(f"{name}={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            parts.append(f"{name}=none")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _cache_file() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "dsgd-teach" / f"worker-baseline-{_fingerprint()}.json"


def measure_baseline(timeout_s: float = 60.0) -> int:
    """Resident bytes of a fresh interpreter after a worker's imports (raises on failure or timeout)."""
    code = (
        f"import {', '.join(WORKER_IMPORTS)}, psutil; "
        "print(psutil.Process().memory_info().rss)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout_s, check=True)
    return int(out.stdout.strip().splitlines()[-1])


def worker_baseline() -> int:
    """A worker's resident bytes after its imports: measured once per environment and cached, else estimated."""
    cache = _cache_file()
    try:
        return int(json.loads(cache.read_text())["baseline"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    try:
        baseline = measure_baseline()
    except (OSError, ValueError, subprocess.SubprocessError):
        return ESTIMATED_BASELINE_BYTES[torch_build()]
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"baseline": baseline, "build": torch_build()}))
        os.replace(tmp, cache)
    except OSError:
        pass  # a read-only home still gets the measured figure, only not remembered
    return baseline


def min_worker_limit(baseline: int | None = None) -> int:
    """The smallest per-worker limit that leaves a worker its working room above its imports before the pause."""
    baseline = worker_baseline() if baseline is None else baseline
    return int((baseline + WORKING_ROOM_BYTES) / pause_fraction())


def plan_worker_memory(n_workers: int, *, baseline: int | None = None, machine: int | None = None,
                       gpu: bool = False, gpu_floor: int = 0) -> MemoryPlan:
    """The per-worker limit: room above the baseline before the pause, more where the machine has it.

    The cluster's share is half the machine's memory, but at least Binder's 2 GiB (the whole machine where it has
    less); every worker also gets at least (baseline + working room) / pause fraction, and gpu_floor on a GPU host.
    Raises WorkerMemoryError where the machine cannot hold the kernel and n workers' imports at all.
    """
    baseline = worker_baseline() if baseline is None else baseline
    machine = machine_memory() if machine is None else machine
    fraction = pause_fraction()
    build = torch_build()
    n = max(1, n_workers)
    if (n + 1) * baseline > machine:
        raise WorkerMemoryError(
            f"{n} worker(s) and this kernel need about {(n + 1) * baseline / MiB:.0f} MiB just to import torch "
            f"({baseline / MiB:.0f} MiB each, torch build: {build}), but this machine allows {machine / MiB:.0f} MiB. "
            f"Use fewer workers" + (f", or {CPU_WHEEL_HINT}" if build == "cuda" else "") + "."
        )
    budget = min(machine, max(BINDER_BUDGET_BYTES, machine // 2))
    share = (budget - baseline) // n  # the kernel holds about one worker's imports itself
    floor = min_worker_limit(baseline)
    limit = max(share, floor, gpu_floor if gpu else 0)
    return MemoryPlan(limit=limit, baseline=baseline, machine=machine, pause_fraction=fraction, build=build)


def _advice(owned: bool) -> str:
    more = ("give each worker more memory: start_client(n, memory_limit='2GiB') or DSGD_WORKER_MEMORY=2GiB"
            if owned else "ask the deployment for more memory per worker (dask worker --memory-limit)")
    hint = f"; or {CPU_WHEEL_HINT}" if torch_build() == "cuda" else ""
    return f"What to do: use fewer workers; {more}{hint}."


def _describe(address: str, info: dict[str, Any], fraction: float) -> str:
    used, limit = info.get("metrics", {}).get("memory") or 0, info.get("memory_limit") or 0
    if not limit:
        return f"{address} holds {used / MiB:.0f} MiB (no memory limit)"
    return (f"{address} holds {used / MiB:.0f} MiB of its {limit / MiB:.0f} MiB limit "
            f"(dask pauses it at {fraction:.0%} = {limit * fraction / MiB:.0f} MiB)")


def scheduler_workers(client: Any) -> dict[str, dict[str, Any]]:
    """The scheduler's own record of every worker (status, memory limit, metrics), asked directly."""
    try:
        info = client.sync(client.scheduler.identity, n_workers=-1)
    except TypeError:  # distributed versions whose identity() takes no n_workers
        info = client.sync(client.scheduler.identity)
    return info["workers"]


def paused_workers(workers: dict[str, dict[str, Any]], addresses: list[str] | None = None) -> list[str]:
    """Addresses (among `addresses`, default all) that dask's memory monitor has paused."""
    wanted = set(workers) if addresses is None else set(addresses)
    return sorted(a for a, w in workers.items() if a in wanted and w.get("status") == "paused")


def memory_error(workers: dict[str, dict[str, Any]], paused: list[str], owned: bool, what: str) -> WorkerMemoryError:
    """A WorkerMemoryError naming each paused worker's figures and what to do."""
    fraction = pause_fraction()
    figures = "; ".join(_describe(a, workers[a], fraction) for a in paused)
    return WorkerMemoryError(
        f"{what}: worker(s) paused by dask's memory monitor, so they start no new task: {figures}. "
        f"torch ({torch_build()} build) alone takes about {worker_baseline() / MiB:.0f} MiB per worker. "
        + _advice(owned)
    )


def check_workers_memory(client: Any, addresses: list[str] | None = None, what: str = "this run cannot start") -> None:
    """Raise WorkerMemoryError when any of `addresses` (default: every worker) is paused; returns at once otherwise."""
    workers = scheduler_workers(client)
    paused = paused_workers(workers, addresses)
    if paused:
        raise memory_error(workers, paused, getattr(client, "_owned_cluster", None) is not None, what)


def worker_footprints(client: Any) -> dict[str, dict[str, int | str]]:
    """Each worker's resident bytes now, memory limit, room before the pause, and dask status (for doctor)."""
    fraction = pause_fraction()
    rss = client.run(lambda: psutil.Process().memory_info().rss)
    out: dict[str, dict[str, int | str]] = {}
    for address, info in scheduler_workers(client).items():
        limit = int(info.get("memory_limit") or 0)
        used = int(rss.get(address, info.get("metrics", {}).get("memory") or 0))
        out[address] = {"rss": used, "limit": limit, "headroom": int(limit * fraction) - used if limit else -1,
                        "status": str(info.get("status"))}
    return out


def wait_futures(client: Any, futures: list[Any], timeout_s: float, what: str, grace_s: float = 2.0) -> None:
    """Wait for futures like distributed.wait, but raise WorkerMemoryError once a paused worker has held them up
    for grace_s, and a TimeoutError after timeout_s that says whether memory was the cause."""
    from distributed import wait

    deadline = time.monotonic() + timeout_s
    paused_since: float | None = None
    while True:
        try:
            wait(futures, timeout=min(0.5, max(0.01, deadline - time.monotonic())))
            return
        except (TimeoutError, asyncio.TimeoutError):  # distinct classes on Python 3.10
            pass
        now = time.monotonic()
        workers = scheduler_workers(client)
        paused = paused_workers(workers)
        paused_since = (paused_since or now) if paused else None
        owned = getattr(client, "_owned_cluster", None) is not None
        if paused_since is not None and now - paused_since >= grace_s:
            raise memory_error(workers, paused, owned, what)
        if now >= deadline:
            raise TimeoutError(f"{what}: not done within {timeout_s:.0f} s (no worker is paused for memory)")
