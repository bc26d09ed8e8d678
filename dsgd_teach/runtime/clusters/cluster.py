"""One call that returns a connected dask client: an existing scheduler, a GPU cluster, or a local one.

Order of choice: a cluster object handed in (dask-jobqueue, dask-gateway, dask-kubernetes, LocalCluster: the
course may scale it and scales it back on close); the scheduler named by DSGD_SCHEDULER (or dask's
`scheduler-address` config) — any dask deployment works, is never resized, and gets the course's worker settings
through a WorkerPlugin that is removed again on close; a new cluster of the student's own from the dask-gateway
named by dask's `gateway.address` config (DASK_GATEWAY__ADDRESS; see gateway.py), shut down on close; else a LocalCUDACluster (one worker per GPU) when
dask-cuda is present and there is a GPU for every worker wanted; else a LocalCluster of single-threaded worker
processes bound to 127.0.0.1, whose workers still use a GPU if they see one. Closing the client closes a cluster
it started.
"""

from __future__ import annotations

import atexit
import logging
import os
import time
import weakref
from dataclasses import dataclass

import dask
from dask.utils import parse_bytes
from distributed import Client, LocalCluster

from ...machine import WORKER_MALLOC, check_n_workers, cpu_count, worker_addresses
from ...memory import (
    BINDER_BUDGET_BYTES,
    MiB,
    WorkerMemoryError,
    pause_fraction,
    plan_worker_memory,
    scheduler_workers,
    worker_baseline,
)
from . import worker_settings
from .gateway import WORKERS_TIMEOUT_S, gateway_address, new_gateway_cluster
from .worker_settings import CourseSettings
from .worker_start import worker_start_settings
from .workers import scale_to

log = logging.getLogger(__name__)

#: Kernel plus cluster should stay within mybinder.org's 2 GiB where the machine has no more (see memory.py).
MEMORY_BUDGET_BYTES = BINDER_BUDGET_BYTES
#: A worker that sees a GPU keeps CUDA's context, cuBLAS and NCCL state in host memory: on an H100 with torch 2.11
#: a worker's RSS went 535 MiB (torch imported) -> 635 (context) -> 773 (a cuBLAS matmul) -> 1117 MiB (an NCCL
#: group), past the CPU floor's terminate threshold. Binder's 2 GiB budget has no GPU, so it does not apply there.
MIN_GPU_WORKER_MEMORY_BYTES = 3 * 1024**3
PLUGIN_NAME = "dsgd-torch-threads"
#: Background timers of an owned cluster, slowed from dask's defaults (20 ms, 500 ms, 100 ms): on 2 cores every
#: wake-up of the scheduler, nannies or workers is taken from the experiment being timed. They drive only the
#: blocked-event-loop warning, the dashboard's system plots and the memory limits' checks. The workers' sampling
#: profiler (every 10 ms, for the dashboard's profile page, which the course does not use) is turned off: it cost
#: an idle worker 2 % of a core, against 0.4 % without it.
QUIET_TIMERS = {
    "distributed.admin.tick.interval": "1s",
    "distributed.admin.system-monitor.interval": "2s",
    "distributed.worker.memory.monitor-interval": "500ms",
    "distributed.worker.profile.enabled": False,
}
def threads_per_worker_process(n_workers: int, cores: int | None = None) -> int:
    """torch intra-op threads for each worker: floor(cores / workers), at least 1 (avoids oversubscription)."""
    cores = cpu_count() if cores is None else cores
    return max(1, cores // max(1, n_workers))


def worker_memory_limit(n_workers: int, gpu: bool = False) -> int:
    """Per-worker memory limit: room above the measured imports, scaled to the machine (memory.py), more on a GPU."""
    return plan_worker_memory(n_workers, gpu=gpu, gpu_floor=MIN_GPU_WORKER_MEMORY_BYTES).limit


def requested_memory_limit(memory_limit: int | str | None) -> int | None:
    """An explicit per-worker limit from the argument or DSGD_WORKER_MEMORY ('2GiB', '1500MB', bytes), else None."""
    value = memory_limit if memory_limit is not None else os.environ.get("DSGD_WORKER_MEMORY") or None
    if value is None:
        return None
    try:
        limit = int(value) if isinstance(value, int) and not isinstance(value, bool) else parse_bytes(str(value))
    except (ValueError, TypeError) as exc:
        raise ValueError(f"memory_limit must be bytes or a size such as '2GiB', got {value!r}") from exc
    if not 64 * MiB <= limit <= 2**50:
        raise ValueError(f"memory_limit must be between 64 MiB and 1 PiB, got {value!r}")
    return limit


def refuse_limit_below_baseline(limit: int) -> None:
    """Raise WorkerMemoryError, before any process starts, when a worker's imports alone would pass the pause."""
    baseline, fraction = worker_baseline(), pause_fraction()
    if limit * fraction <= baseline:
        raise WorkerMemoryError(
            f"a worker limit of {limit / MiB:.0f} MiB cannot hold a worker's own imports: torch and the course take "
            f"{baseline / MiB:.0f} MiB, and dask pauses a worker at {fraction:.0%} of its limit "
            f"({limit * fraction / MiB:.0f} MiB), so every task would wait for ever. What to do: leave memory_limit "
            f"unset (the course sizes it from that figure), or give each worker at least "
            f"{(baseline / fraction + 128 * MiB) / MiB:.0f} MiB."
        )


def check_workers_fit(client: Client) -> None:
    """Raise WorkerMemoryError when a worker the course just started already holds more than its pause threshold."""
    fraction = pause_fraction()
    rss = client.run(lambda: __import__("psutil").Process().memory_info().rss)
    workers = scheduler_workers(client)
    over = [(a, rss[a], workers[a].get("memory_limit") or 0) for a in sorted(rss) if a in workers]
    over = [(a, used, limit) for a, used, limit in over if limit and used >= limit * fraction]
    if over:
        figures = "; ".join(
            f"{a} holds {used / MiB:.0f} MiB of its {limit / MiB:.0f} MiB limit (paused at {fraction:.0%} = "
            f"{limit * fraction / MiB:.0f} MiB)" for a, used, limit in over
        )
        raise WorkerMemoryError(
            f"the cluster's workers cannot hold their own imports, so dask pauses them and nothing could run: "
            f"{figures}. A worker needs about {worker_baseline() / MiB:.0f} MiB once torch is imported. What to do: "
            "leave memory_limit unset (the course sizes it from that figure), or give each worker more, e.g. "
            "start_client(n, memory_limit='2GiB'); use fewer workers where the machine is small."
        )


def visible_gpus() -> int:
    """CUDA devices this process sees (worker processes it starts see the same); 0 without CUDA."""
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # pragma: no cover - a broken CUDA install counts as none
        return 0


@dataclass
class ClusterInfo:
    """How the client was obtained: kind is 'external', 'handed', 'gateway', 'cuda' or 'local'; note says why."""

    kind: str
    note: str
    dashboard_link: str | None


class CourseClient(Client):
    """A dask Client that also closes the cluster it started, and knows how to resize it."""

    info: ClusterInfo
    _owned_cluster: LocalCluster | None = None
    _handed_cluster: object | None = None  # a cluster object the user passed in: scaled, never closed
    _handed_size: int = 0  # its worker count when handed in, restored on close
    _settings_plugin: bool = False  # CourseSettings registered on workers the course did not start
    _torch_threads: int | None = None  # torch threads per worker where the cluster fixes its cores (a gateway's)

    def close(self, *args, **kwargs):  # noqa: ANN002, ANN003 - mirrors Client.close
        """Close the client and, if this client started it, the cluster; leave a deployment as it was found."""
        try:
            self._restore_deployment()
        except Exception as exc:  # still close the client; say what could not be undone
            log.warning("could not restore the deployment on close: %s: %s", type(exc).__name__, exc)
        try:
            return super().close(*args, **kwargs)
        finally:
            cluster, self._owned_cluster = self._owned_cluster, None
            if cluster is not None:
                cluster.close()

    def _restore_deployment(self) -> None:
        """Remove the course's worker plugin and scale a handed-in cluster back to the size it came with."""
        if self.status not in ("running", "connecting"):
            return
        if self._settings_plugin:
            self._settings_plugin = False
            worker_settings.remove(self)
        handed, self._handed_cluster = self._handed_cluster, None
        if handed is not None and self.n_workers() != self._handed_size:
            handed.scale(self._handed_size)

    def n_workers(self) -> int:
        """Number of workers currently connected."""
        return len(worker_addresses(self))

    def resize(self, n_workers: int, timeout: float = 60.0) -> str:
        """Scale the local cluster to n_workers, reset torch threads, and say what happened in one line."""
        check_n_workers("n_workers", n_workers)
        if self._owned_cluster is None and self._handed_cluster is not None:
            scale_to(self, self._handed_cluster, n_workers, timeout)
            return f"{self.n_workers()} worker(s) in the cluster handed in (it goes back to {self._handed_size} on close)"
        if self._owned_cluster is None:
            raise RuntimeError(
                "this client is connected to an external scheduler; resize that deployment with its own tools "
                "(dsgd_teach.runtime.clusters.workers.get_workers runs with what fits instead)"
            )
        if n_workers == self.n_workers():
            return _describe(n_workers)
        gpus = len(getattr(self._owned_cluster, "cuda_visible_devices", None) or ())
        if self.info.kind == "cuda" and n_workers > gpus:
            raise RuntimeError(
                f"this GPU cluster runs one worker per GPU and has {gpus} GPU(s), so it cannot grow to {n_workers} "
                "workers; start_client(n, use_gpu=False) gives CPU worker processes, which still use the GPU"
            )
        with dask.config.set(worker_start_settings()):  # new workers start as the first ones did
            self._owned_cluster.scale(n_workers)
            deadline = time.monotonic() + timeout
            while self.n_workers() != n_workers:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"cluster did not reach {n_workers} workers within {timeout:.0f} s")
                time.sleep(0.05)
        threads = self._torch_threads or threads_per_worker_process(n_workers)
        self.register_plugin(CourseSettings(threads=threads), name=PLUGIN_NAME)
        return _describe(n_workers)


def _describe(n_workers: int) -> str:
    cores = cpu_count()
    line = f"{n_workers} worker process(es) on {cores} core(s), torch threads per worker = "
    line += str(threads_per_worker_process(n_workers, cores))
    if n_workers > cores:
        line += "; more workers than cores: the OS time-slices them, so they do not all run at once"
    return line


_open_clients: weakref.WeakSet[CourseClient] = weakref.WeakSet()


def _close_all_at_exit() -> None:
    for client in list(_open_clients):
        try:
            client.close()
        except Exception:  # pragma: no cover - best effort at interpreter exit
            pass


atexit.register(_close_all_at_exit)


def _external_address(scheduler: str | None) -> str | None:
    return scheduler or os.environ.get("DSGD_SCHEDULER") or dask.config.get("scheduler-address", None)


def _gpu_cluster(n_workers: int | None, gpus: int, asked: bool) -> tuple[LocalCluster | None, str]:
    """A LocalCUDACluster (one worker per GPU) or None and the reason it was not used.

    Without an explicit worker count, "auto" (asked=False) wants at least two GPUs: the chapters' experiments
    need two or more workers, and a one-worker GPU cluster cannot grow past its GPUs.
    """
    if gpus == 0:
        return None, "no GPU visible"
    if n_workers is not None:
        wanted = n_workers
    elif asked or gpus >= 2:
        wanted = gpus  # one worker per GPU
    else:
        wanted = 2  # "auto" with one GPU: the chapters need two workers
    if wanted > gpus:
        return None, (
            f"{gpus} GPU(s) visible, fewer than the {wanted} workers wanted (one per GPU); "
            "CPU worker processes, which still use the GPU"
        )
    try:
        from dask_cuda import LocalCUDACluster
    except ImportError:
        return None, f"{gpus} GPU(s) visible but dask-cuda is not installed (pip install 'dsgd-teach[gpu]')"
    try:
        cluster = LocalCUDACluster(
            host="127.0.0.1",
            dashboard_address="127.0.0.1:0",
            n_workers=wanted,
            threads_per_worker=1,
        )
        return cluster, f"LocalCUDACluster with one worker per GPU ({gpus} visible)"
    except Exception as exc:
        return None, f"GPU cluster failed to start, falling back to CPU: {type(exc).__name__}: {exc}"


def _apply_settings(client: CourseClient) -> str:
    """Register the course's worker settings on a deployment it did not start; a clear error if it cannot."""
    try:
        line = worker_settings.apply(client)
    except Exception as exc:
        client.close()
        raise RuntimeError(
            f"the workers at {client.scheduler.address} could not take the course's settings ({type(exc).__name__}: "
            f"{exc}); every worker needs the same Python packages as this kernel (pip install dsgd-teach)"
        ) from exc
    client._settings_plugin = True
    return line


def _gateway_client(n: int, memory_limit: int | None) -> tuple[CourseClient, str]:
    """A client of a new gateway cluster grown to n workers that fit (shut down again if anything fails)."""
    cluster, note, cores = new_gateway_cluster(memory_limit)
    try:
        client = CourseClient(cluster, security=cluster.security, timeout="20s")
    except BaseException:
        cluster.close()
        raise
    client._owned_cluster, client._torch_threads = cluster, cores
    client.info = ClusterInfo("gateway", note, client.dashboard_link)
    try:
        client.resize(n, timeout=WORKERS_TIMEOUT_S)
        check_workers_fit(client)
    except BaseException:  # leave no cluster behind
        client.close()
        raise
    return client, f"{note}: {n} worker(s)"


def start_client(
    n_workers: int | None = None,
    *,
    scheduler: str | None = None,
    cluster: object | None = None,
    use_gpu: bool | str = "auto",
    memory_limit: int | str | None = None,
    quiet: bool = False,
) -> CourseClient:
    """Return a connected client (see the module docstring for the order of choice) and print how it started.

    cluster: a dask cluster object (anything with `scale` and a scheduler), e.g. a dask_jobqueue.SLURMCluster.
    memory_limit: per-worker limit of a cluster the course starts ('2GiB'; default: DSGD_WORKER_MEMORY, else
    planned from a worker's measured footprint and the machine's memory, see memory.py).
    """
    explicit_limit = requested_memory_limit(memory_limit)
    if n_workers is not None:
        check_n_workers("n_workers", n_workers)
    t0 = time.perf_counter()
    address = None if cluster is not None else _external_address(scheduler)
    if cluster is not None:
        if not hasattr(cluster, "scale") or not hasattr(cluster, "scheduler_address"):
            raise ValueError(f"cluster must be a dask cluster object with scale(), got {type(cluster).__name__}")
        client = CourseClient(cluster, timeout="20s")
        client._handed_cluster, client._handed_size = cluster, client.n_workers()
        note = f"using the {type(cluster).__name__} handed in ({client._handed_size} worker(s); scaled as needed)"
        kind = "handed"
        note += "; " + _apply_settings(client)
    elif address:
        client = CourseClient(address, timeout="20s")
        note = f"connected to the existing scheduler at {address}"
        kind = "external"
        note += "; " + _apply_settings(client)
    elif gateway_address() is not None:
        client, note = _gateway_client(n_workers or 2, explicit_limit)
        kind = "gateway"
    else:
        reason = "GPU use switched off"
        gpus = visible_gpus()
        if use_gpu:
            cluster, reason = _gpu_cluster(n_workers, gpus, asked=use_gpu is True)
        if cluster is not None:
            kind, note = "cuda", reason
        else:
            n = n_workers or min(2, cpu_count()) or 1
            limit = explicit_limit or worker_memory_limit(n, gpu=gpus > 0)
            refuse_limit_below_baseline(limit)
            environ = {**dask.config.get("distributed.nanny.pre-spawn-environ", {}), **WORKER_MALLOC}
            settings = {**QUIET_TIMERS, **worker_start_settings(), "distributed.nanny.pre-spawn-environ": environ}
            with dask.config.set(settings):  # read when the scheduler and nannies start; passed on to workers
                cluster = LocalCluster(
                    n_workers=n,
                    threads_per_worker=1,
                    processes=True,
                    host="127.0.0.1",
                    scheduler_port=0,
                    dashboard_address="127.0.0.1:0",
                    memory_limit=limit,
                    silence_logs=logging.ERROR,
                )
            kind = "local"
            note = f"LocalCluster ({reason}): " + _describe(n)
        client = CourseClient(cluster)
        client._owned_cluster = cluster
        n_now = len(cluster.scheduler_info["workers"])
        try:
            client.register_plugin(CourseSettings(threads=threads_per_worker_process(n_now)), name=PLUGIN_NAME)  # imports torch
            check_workers_fit(client)
        except BaseException:  # leave no process behind
            client.close()
            raise
    client.info = ClusterInfo(kind, note, client.dashboard_link)
    _open_clients.add(client)
    if not quiet:
        print(f"{note}. Started in {time.perf_counter() - t0:.1f} s. Dashboard: {client.dashboard_link}")
    return client
