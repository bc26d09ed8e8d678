"""Calibration: fit the simulator's machine numbers on one real run, then predict the others and compare.

From a real synchronous run (chapter 04's run_sync) we take the per-gradient compute times (their median and the
spread of their logarithm) and the per-step overhead (step time minus the slowest aggregated worker's busy
time, which is one pull and one push through the coordinator: two messages, so alpha is half of it), then nudge
alpha until the simulated median step time of that run matches the real one. Those numbers come from the
smallest run only; the simulator then predicts every run's step-time distribution, with
chapter 04's straggler model replaying the very delays the real run injected.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..runtime.clusters.workers import get_workers
from ..trace import Result, ratio
from .config import from_config
from .run import run_simulated


def step_times(trace: pd.DataFrame) -> np.ndarray:
    """Seconds per synchronous step from a (real or simulated) sync trace, without step 0 (start-up)."""
    rows = trace[(trace.event == "update") & (trace.worker == -1)].sort_values("step")
    return rows.step_s.to_numpy(dtype=float)[1:]


def fit_machine(trace: pd.DataFrame) -> dict[str, Any]:
    """compute_s, compute_cv and alpha_s fitted from a sync trace (bandwidth ignored: the messages are small)."""
    grads = trace[trace.event.isin(["gradient", "discarded"])]
    compute = grads.compute_s.to_numpy(dtype=float)
    compute = compute[compute > 0]
    if compute.size == 0:
        raise ValueError("the trace has no gradient events with compute_s; pass a run_sync trace")
    updates = trace[(trace.event == "update") & (trace.worker == -1)].sort_values("step").iloc[1:]
    overhead = (updates.step_s - updates.slowest_busy_s).to_numpy(dtype=float)
    overhead = overhead[np.isfinite(overhead)]
    return {
        "compute_s": float(np.median(compute)),
        "compute_cv": float(np.std(np.log(compute))) if compute.size > 1 else 0.0,
        "alpha_s": float(max(np.median(overhead), 0.0) / 2) if overhead.size else 0.0,
        "bandwidth_Bps": None,
        "server_s": 0.0,
    }


def refine_alpha(config: Any, machine: dict[str, Any], target_s: float, rounds: int = 4) -> dict[str, Any]:
    """Adjust alpha so the simulated median step time of config equals target_s (medians are not additive, so
    the first guess from the overheads is a little off); each step changes by about 2 alpha per unit alpha."""
    machine = dict(machine)
    for _ in range(rounds):
        sim_s = float(np.median(step_times(run_simulated(from_config(config, **machine)).trace)))
        if not np.isfinite(sim_s) or abs(sim_s - target_s) <= 0.01 * target_s:
            break
        machine["alpha_s"] = max(0.0, machine["alpha_s"] + (target_s - sim_s) / 2)
    return machine


def calibrate(
    real: dict[int, Result], fit_on: int | None = None, *, per_run_compute: bool = True
) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Fit on real[fit_on] (default: the smallest N), simulate every N, compare median step times.

    With per_run_compute each run's own measured compute times (median and spread) feed its simulation: on a
    machine with fewer cores than workers, or with torch threads split between workers, a gradient's cost
    depends on N, and that is an input to the model, not something it predicts. The coordination cost (alpha)
    always comes from the fitted run alone.

    Returns (table with n, real_median_ms, sim_median_ms, ratio, fitted and one row per N, machine) and keeps
    the step-time samples of both in table.attrs["samples"] for plotting.
    """
    if not real:
        raise ValueError("calibrate needs at least one real run")
    fit_on = min(real) if fit_on is None else fit_on
    base = real[fit_on]
    machine = refine_alpha(base.config, fit_machine(base.trace), float(np.median(step_times(base.trace))))
    rows, samples = [], {}
    for n, result in sorted(real.items()):
        own = machine
        if per_run_compute and n != fit_on:
            fitted = fit_machine(result.trace)
            own = {**machine, "compute_s": fitted["compute_s"], "compute_cv": fitted["compute_cv"]}
        sim = run_simulated(from_config(result.config, **own))
        real_s, sim_s = step_times(result.trace), step_times(sim.trace)
        samples[n] = {"real": real_s, "sim": sim_s}
        real_med, sim_med = float(np.median(real_s)), float(np.median(sim_s))
        rows.append({
            "n": n, "real_median_ms": real_med * 1e3, "sim_median_ms": sim_med * 1e3,
            "ratio": ratio(sim_med, real_med), "fitted": n == fit_on,
        })
    table = pd.DataFrame(rows)
    table.attrs["samples"] = samples
    return table, machine


def real_runs(client: Any, ns: tuple[int, ...], **fields: Any) -> dict[int, Result]:
    """Run chapter 04's synchronous SGD on the cluster for each N (resizing it up when needed), same other fields."""
    from ..syncasync import SyncConfig, run_sync

    out = {}
    for n in ns:
        if not get_workers(client, n).enough:
            continue  # a deployment the course may not scale: the Ns that fit (the chapter says what is missing)
        out[n] = run_sync(SyncConfig(workers=n, **fields), client)
    return out
