"""Benchmark of the simulator: how fast it simulates 1000 workers, and how well it predicts the real cluster.

Figures: wall seconds to simulate 1000 synchronous workers x 100 steps and 1000 asynchronous workers x 2000
updates (timing mode), simulated seconds per wall second, and the calibration ratios (simulated median step time /
real median step time, fitted on the 1-worker run, goal 0.8-1.2) for N = 1, 2, 3 on a real cluster.
"""

from __future__ import annotations

import time
from typing import Any

from ..config import sized
from ..sim import SimConfig, calibrate, real_runs, run_simulated


def _timed(config: SimConfig) -> tuple[float, dict[str, Any]]:
    t = time.perf_counter()
    summary = run_simulated(config).summary
    return time.perf_counter() - t, summary


def measure() -> dict[str, Any]:
    """Simulator speed at 1000 workers, and calibration against the real cluster for N <= 4."""
    from .runner import with_client

    out: dict[str, Any] = {}
    steps = sized(100, 10)
    wall, s = _timed(SimConfig(workers=1000, steps=steps, straggler="exponential", severity=0.01, compute_cv=0.2))
    out["sync_1000w_steps"] = steps
    out["sync_1000w_wall_s"] = round(wall, 3)
    out["sync_1000w_sim_per_wall_ratio"] = s["sim_time_s"] / wall
    updates = sized(2000, 200)
    wall, s = _timed(SimConfig(algorithm="async", workers=1000, steps=updates, compute_cv=0.2))
    out["async_1000w_updates"] = updates
    out["async_1000w_wall_s"] = round(wall, 3)
    out["async_1000w_mean_staleness"] = s["mean_staleness"]
    ns = (1, 2, 3)  # 4 workers get 384 MiB each and dask pauses them once torch is loaded
    fields = {"steps": sized(40, 12), "straggler": "exponential", "severity": 0.01, "batch_size": 32, "timeout_s": 180.0}
    t = time.perf_counter()
    real = {}
    for n in ns:  # a fresh cluster per N: every run starts from the same unloaded worker processes
        with with_client(n) as client:
            real.update(real_runs(client, (n,), **fields))
    out["calibration_real_runs_s"] = round(time.perf_counter() - t, 2)
    table, machine = calibrate(real)
    out["fitted_compute_ms"] = machine["compute_s"] * 1e3
    out["fitted_alpha_ms"] = machine["alpha_s"] * 1e3
    for row in table.itertuples():
        out[f"n{row.n}_real_median_ms"] = row.real_median_ms
        out[f"n{row.n}_sim_median_ms"] = row.sim_median_ms
        out[f"n{row.n}_sim_over_real_ratio"] = row.ratio
    return out


if __name__ == "__main__":
    import json

    print(json.dumps(measure(), indent=2))
