"""Cluster start-up time, and the per-step overhead of synchronous data parallelism over the sequential loop."""

from __future__ import annotations

import time

import numpy as np

from ..runtime.clusters.cluster import start_client
from ..sgd import DataParallelConfig, SGDConfig, run_data_parallel, run_sgd


def _sequential_step_ms(result) -> float:
    """Median time between consecutive update events of a run_sgd trace (the loop runs on one worker)."""
    t = result.trace[result.trace.event == "update"].time.to_numpy()
    return float(np.median(np.diff(t)) * 1e3)


def measure() -> dict[str, float]:
    """Start-up seconds, sequential step ms, data-parallel step ms (1 and 2 workers) and their ratios."""
    starts = []
    for _ in range(2):
        t = time.perf_counter()
        client = start_client(2, quiet=True, use_gpu=False)
        client.submit(sum, [1], pure=False).result(timeout=60)
        starts.append(time.perf_counter() - t)
        if len(starts) < 2:
            client.close()
    try:
        steps = 200
        run_sgd(SGDConfig(steps=20), client)  # warm the workers (data built, torch initialised)
        seq = _sequential_step_ms(run_sgd(SGDConfig(batch_size=64, steps=steps), client))
        dp1 = run_data_parallel(DataParallelConfig(workers=1, batch_size=64, steps=steps), client)
        dp2 = run_data_parallel(DataParallelConfig(workers=2, batch_size=32, steps=steps), client)
        t = time.perf_counter()
        for i in range(50):
            client.submit(int, i, pure=False).result()
        round_trip_ms = (time.perf_counter() - t) / 50 * 1e3
    finally:
        client.close()
    step1, step2 = dp1.summary["median_step_ms"], dp2.summary["median_step_ms"]
    return {
        "cluster_start_s": round(float(np.median(starts)), 3),
        "task_round_trip_ms": round(round_trip_ms, 3),
        "sequential_step_ms": round(seq, 3),
        "data_parallel_1w_step_ms": round(step1, 3),
        "data_parallel_2w_step_ms": round(step2, 3),
        "data_parallel_2w_overhead_ms": round(step2 - seq, 3),
        "data_parallel_2w_vs_sequential_step_ratio": round(step2 / seq, 2),
        "data_parallel_2w_step_vs_task_round_trip_ratio": round(step2 / round_trip_ms, 2),
    }
