"""The papers, reproduced at scale in the simulator (timing mode: only the clocks move, so 1000 workers are cheap).

* Chen et al. (2016)'s backup workers: here 96 + 4 backups against 100 synchronous workers under a heavy-tailed
  straggler model;
  the step time is the N-th order statistic of the N + b compute-plus-delay times (order_statistic_check).
* Zhang et al. (2015, section 2.4 and its Figure 1): the mean staleness of asynchronous SGD is about the number
  of learners; the course's count for N equal workers is N - 1.
* Baidu / Horovod (Sergeev & Del Balso 2018): ring allreduce time stays flat in N, a central server's grows.
* McMahan & Streeter (2014): at delays of ~1000 updates AdaRevision beats AdaGrad (delay_tolerance, real gradients).
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from ..trace import Result
from .config import SimConfig
from .delays import delays_of
from .run import run_simulated


def backups_vs_sync(
    total: int = 100, backups: int = 4, steps: int = 50, straggler: str = "lognormal", severity: float = 0.02,
    compute_s: float = 0.05, compute_cv: float = 0.1, seed: int = 0, **fields: Any,
) -> dict[str, Result]:
    """Chen et al.: `total` synchronous workers against `total - backups` + `backups` (same machines)."""
    base = SimConfig(
        algorithm="sync", workers=total, steps=steps, straggler=straggler, severity=severity,
        compute_s=compute_s, compute_cv=compute_cv, seed=seed, **fields,
    )
    return {
        f"{total} sync": run_simulated(base),
        f"{total - backups} + {backups} backups": run_simulated(base.replace(workers=total - backups, backups=backups)),
    }


def order_statistic_check(
    total: int = 100, backups: int = 4, steps: int = 50, straggler: str = "lognormal", severity: float = 0.02,
    compute_s: float = 0.05, compute_cv: float = 0.1, seed: int = 0,
) -> pd.DataFrame:
    """Per step, the simulated step time next to the formula T = (c + d)_(N : N+b), the N-th smallest of the
    N + b compute-plus-delay times, evaluated on the very draws the simulator used (ideal network: alpha = 0,
    infinite bandwidth, so the formula and the simulation model the same thing)."""
    config = SimConfig(
        algorithm="sync", workers=total - backups, backups=backups, steps=steps, straggler=straggler,
        severity=severity, compute_s=compute_s, compute_cv=compute_cv, seed=seed, alpha_s=0.0, bandwidth_Bps=None,
    )
    updates = run_simulated(config).trace.query("event == 'update'").sort_values("step")
    draws = delays_of(config)
    rows = []
    for step, step_s in zip(updates.step.astype(int), updates.step_s, strict=True):
        times = sorted(draws.compute(r, step) + draws.injected(r, step) for r in range(config.world))
        rows.append({"step": step, "simulated_s": float(step_s), "formula_s": times[config.workers - 1],
                     "slowest_s": times[-1]})
    return pd.DataFrame(rows)


def staleness_vs_workers(
    ns: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000), updates_per_worker: int = 4,
    compute_s: float = 0.05, compute_cv: float = 0.3, seed: int = 0, **fields: Any,
) -> pd.DataFrame:
    """Mean staleness of plain async SGD for each N (after the first N pushes: steady state) next to N - 1."""
    rows = []
    for n in ns:
        config = SimConfig(
            algorithm="async", workers=n, steps=max(n * updates_per_worker, 8), compute_s=compute_s,
            compute_cv=compute_cv, seed=seed, **fields,
        )
        s = run_simulated(config).summary
        rows.append({
            "workers": n, "mean_staleness": s["steady_mean_staleness"], "all_pushes_mean": s["mean_staleness"],
            "max_staleness": s["max_staleness"], "n_minus_1": n - 1,
        })
    return pd.DataFrame(rows)


def delay_tolerance(
    workers: tuple[int, ...] = (4, 1400), optimizers: tuple[str, ...] = ("adagrad", "adarevision"),
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4), steps: int = 3000, lr: float = 0.5, compute_cv: float = 0.3,
    dataset: str = "sparse", batch_size: int = 8, **fields: Any,
) -> pd.DataFrame:
    """Final training loss of async SGD with each server rule after the same `steps` updates, real gradients.

    N equal-speed workers give a mean delay of about N - 1 updates once all are running (Reproduction 2), so
    workers=(4, 1400) with 3000 updates puts the rules at mean delays of ~3 and ~1070 updates. The default
    problem is the course's sparse, RCV1-like logistic regression, the kind of data McMahan & Streeter used.
    One row per (workers, optimizer, seed); see delay_summary.
    """
    rows = []
    for n in workers:
        for optimizer in optimizers:
            for seed in seeds:
                config = SimConfig(
                    algorithm="async", mode="real", workers=n, steps=steps, lr=lr, optimizer=optimizer, seed=seed,
                    compute_cv=compute_cv, eval_every=steps, alpha_s=0.0, bandwidth_Bps=None, dataset=dataset,
                    batch_size=batch_size, **fields,
                )
                s = run_simulated(config).summary
                rows.append({
                    "workers": n, "optimizer": optimizer, "seed": seed, "mean_staleness": s["mean_staleness"],
                    "steady_staleness": s["steady_mean_staleness"], "final_train_loss": s["final_train_loss"],
                })
    return pd.DataFrame(rows)


def delay_summary(runs: pd.DataFrame) -> pd.DataFrame:
    """Mean and standard deviation over seeds of delay_tolerance's losses and delays, per (workers, optimizer)."""
    return runs.groupby(["workers", "optimizer"]).agg(
        mean_delay=("mean_staleness", "mean"), steady_delay=("steady_staleness", "mean"),
        loss_mean=("final_train_loss", "mean"),
        loss_sd=("final_train_loss", "std"), seeds=("seed", "count"),
    ).reset_index()


def allreduce_vs_workers(
    ns: tuple[int, ...] = (2, 4, 8, 16, 32, 64, 128, 256, 512, 1000), elements: int = 25_000_000,
    alpha_s: float = 5e-6, bandwidth_Bps: float = 10e9, comms: tuple[str, ...] = ("naive", "doubling", "ring"),
) -> pd.DataFrame:
    """Seconds of one allreduce of `elements` float32 for each algorithm and N (a 100 MB model by default)."""
    rows = []
    for comm in comms:
        for n in ns:
            config = SimConfig(
                algorithm="allreduce", comm=comm, workers=n, steps=1, elements=elements, alpha_s=alpha_s,
                bandwidth_Bps=bandwidth_Bps,
            )
            s = run_simulated(config).summary
            rows.append({"algorithm": comm, "workers": n, "seconds": s["median_ms"] / 1e3})
    return pd.DataFrame(rows)
