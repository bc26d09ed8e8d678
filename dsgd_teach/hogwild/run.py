"""The driver side: create the shared block, start the ranks on the cluster, always free the block, summarise.

run_hogwild and run_counting follow the course's one experiment API: run_xxx(config, client, on_update) -> Result.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
from distributed import Client

from ..runtime.clusters.workers import get_workers, host_of
from ..runtime.ranks.live import run_live
from ..trace import OnUpdate, Result, TraceRecorder, ratio
from .config import CountingConfig, HogwildConfig
from .kernels import accuracy, mean_loss
from .mutex import HAVE_MUTEX
from .problem import load_data
from .reference import sequential_counts
from .shm import create_block
from .tasks import block_arrays, process_task, threads_task

AnyConfig = HogwildConfig | CountingConfig


def check_platform_and_workers(config: AnyConfig, client: Client) -> None:
    """Refuse runs whose ranks could not all run at once (a dask worker runs one task at a time)."""
    if config.lock and not HAVE_MUTEX:
        raise RuntimeError("lock=True needs POSIX pthread mutexes, which this platform lacks")
    if getattr(config, "round_robin", False) and not HAVE_MUTEX:
        raise RuntimeError("round_robin=True needs POSIX (sched_yield), which this platform lacks")
    get_workers(client, config.workers if config.backend == "processes" else 1, policy="present",
                what=f"workers={config.workers}", instead="use backend='threads'")


def _run_ranks(config: AnyConfig, client: Client, recorder: TraceRecorder) -> tuple[np.ndarray, list[dict], bool, str]:
    """Run every rank against a fresh shared block: (final shared vector, per-rank stats, stopped, the host).

    Worker processes share the block through /dev/shm, so they must all live on one host: get_workers(policy="this_host") picks
    them (or says no host has enough). The driver creates the block, so that host must be the driver's too;
    the threads backend runs on a single worker and shares the block with it.
    """
    check_platform_and_workers(config, client)
    addresses = get_workers(client, config.workers if config.backend == "processes" else 1, policy="this_host").addresses
    hosts = ",".join(sorted({host_of(a) for a in addresses}))  # the one host whose /dev/shm the ranks share
    n_features = config.data_spec.n_features
    arrays = block_arrays(config, n_features)
    with create_block(arrays) as block:
        try:
            if config.backend == "processes":
                args = [(config, block.spec)] * config.workers
                results, stopped = run_live(client, process_task, args, recorder, timeout_s=config.timeout_s,
                                            addresses=addresses)
            else:
                (results,), stopped = run_live(
                    client, threads_task, [(config, block.spec)], recorder, timeout_s=config.timeout_s,
                    addresses=addresses,
                )
                results = results or []
        finally:  # a rank still waiting for its turn (its peer died, or the run timed out) gives up now
            block["abort"][0] = 1
        final = block[arrays[0][0]].copy()
    return final, [r for r in results if r is not None], stopped, hosts


def _timing(stats: list[dict[str, Any]], t0: float) -> dict[str, float]:
    """Parallel-section wall time (first start to last finish), the updates per second over it, and when it
    began on the trace's clock (startup before it: launching tasks, building data, loading kernels)."""
    if not stats:
        return {"updates": 0, "parallel_s": float("nan"), "updates_per_s": float("nan"), "start_s": float("nan")}
    updates = int(sum(s["updates"] for s in stats))
    start = min(s["t_start"] for s in stats)
    span = max(s["t_end"] for s in stats) - start
    rate = ratio(updates, span)
    return {"updates": updates, "parallel_s": span, "updates_per_s": rate, "start_s": start - t0}


def run_hogwild(config: HogwildConfig, client: Client, on_update: OnUpdate | None = None) -> Result:
    """Hogwild SGD on the cluster (or a baseline: lock=True, the locked loop; round_robin=True, workers taking
    turns; workers=1, sequential SGD)."""
    if not isinstance(config, HogwildConfig):
        raise TypeError(f"run_hogwild needs a HogwildConfig, got {type(config).__name__}")
    recorder = TraceRecorder(on_update)
    t = time.perf_counter()
    w, stats, stopped, hosts = _run_ranks(config, client, recorder)
    data = load_data(config.data_spec)
    summary: dict[str, Any] = {
        "workers": config.workers,
        "lock": config.lock,
        "scheme": config.scheme,
        "hosts": hosts,
        **_timing(stats, recorder.t0),
        "initial_train_loss": math.log(2.0),
        "final_train_loss": mean_loss(w, data.X, data.y),
        "test_accuracy": accuracy(w, data.X_test, data.y_test),
        "run_s": time.perf_counter() - t,
    }
    return Result(config, recorder.frame(), summary, w, stopped)


def run_counting(config: CountingConfig, client: Client, on_update: OnUpdate | None = None) -> Result:
    """The lost-update experiment: increments intended vs increments that landed in the shared counters."""
    if not isinstance(config, CountingConfig):
        raise TypeError(f"run_counting needs a CountingConfig, got {type(config).__name__}")
    if config.dataset != "sparse":
        raise ValueError("the counting experiment runs on dataset='sparse' (set density=1.0 for dense rows)")
    recorder = TraceRecorder(on_update)
    t = time.perf_counter()
    counts, stats, stopped, hosts = _run_ranks(config, client, recorder)
    intended = int(sum(s["intended"] for s in stats))
    landed = int(counts.sum())
    summary: dict[str, Any] = {
        "workers": config.workers,
        "lock": config.lock,
        "density": config.density,
        "hosts": hosts,
        **_timing(stats, recorder.t0),
        "intended": intended,
        "landed": landed,
        "lost": intended - landed,
        "lost_fraction": ratio(intended - landed, intended),
        "run_s": time.perf_counter() - t,
    }
    if not stopped:
        expected = sequential_counts(load_data(config.data_spec), config.passes)
        summary["features_short"] = int(np.sum(counts < expected))
    return Result(config, recorder.frame(), summary, counts, stopped)
