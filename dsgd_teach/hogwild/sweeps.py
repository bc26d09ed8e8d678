"""The chapter's measurements, each a small loop over run_hogwild / run_counting returning a tidy DataFrame.

Baselines are measured in the same call as what they are compared with: sequential SGD (one worker), Hogwild,
the same loop with a lock around every update, and the same loop with the workers taking turns (round-robin).
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
from distributed import Client

from ..runtime.clusters.cluster import cpu_count
from ..trace import Result
from .config import CountingConfig, HogwildConfig
from .run import run_counting, run_hogwild

#: The ways the workers may coordinate their writes, as config changes (HogwildConfig.scheme names them).
SCHEMES = {
    "lock-free": {"lock": False, "round_robin": False},
    "locked": {"lock": True, "round_robin": False},
    "round-robin": {"lock": False, "round_robin": True},
}


def warm(client: Client, config: HogwildConfig) -> None:
    """One short run per kernel so every worker has built the data and loaded the compiled kernels."""
    for changes in SCHEMES.values():
        run_hogwild(config.replace(epochs=1, **changes), client)


def baselines(client: Client, config: HogwildConfig) -> dict[str, Result]:
    """Sequential SGD, Hogwild with config.workers, the locked loop and the round-robin loop, in one call."""
    n = config.workers
    return {
        "sequential SGD": run_hogwild(config.replace(workers=1, **SCHEMES["lock-free"]), client),
        f"Hogwild, {n} workers": run_hogwild(config.replace(**SCHEMES["lock-free"]), client),
        f"locked, {n} workers": run_hogwild(config.replace(**SCHEMES["locked"]), client),
        f"round-robin, {n} workers": run_hogwild(config.replace(**SCHEMES["round-robin"]), client),
    }


def _row(result: Result, **extra: object) -> dict[str, object]:
    keep = ("workers", "lock", "scheme", "updates", "parallel_s", "updates_per_s", "final_train_loss")
    return {**extra, **{k: result.summary[k] for k in keep if k in result.summary}}


def interleaved_runs(
    client: Client, config: HogwildConfig, settings: Sequence[tuple[int, str]], repeats: int = 1
) -> pd.DataFrame:
    """Every run of every (workers, scheme) setting (a scheme is a key of SCHEMES), one row each, taking the
    settings in turn within each repeat.

    Taking turns means the runs compared in one repeat happened within a second or two of each other, so a
    slow spell of the machine (other programs, a busy memory system) affects them alike.
    """
    rows = []
    for repeat in range(repeats):
        for n, scheme in settings:
            r = run_hogwild(config.replace(workers=n, **SCHEMES[scheme]), client)
            rows.append(_row(r, repeat=repeat, dataset=config.dataset, density=config.data_spec.density))
    return pd.DataFrame(rows)


def scaling(
    client: Client,
    config: HogwildConfig,
    workers: Sequence[int] = (1, 2),
    locks: Sequence[bool] = (False, True),
    repeats: int = 1,
) -> pd.DataFrame:
    """Updates per second against workers, with and without the lock; speedup is against 1 lock-free worker.

    Each setting is run `repeats` times (interleaved) and the best throughput kept (the least disturbed by other
    programs).
    """
    settings = [(n, "locked" if lock else "lock-free") for n in workers for lock in locks]
    runs = interleaved_runs(client, config, settings, repeats)
    best = runs.loc[runs.groupby(["workers", "lock"], sort=False).updates_per_s.idxmax()]
    df = best.drop(columns="repeat").reset_index(drop=True)
    ref = df[(df.workers == df.workers.min()) & (~df.lock)].updates_per_s.max()
    df["speedup"] = df.updates_per_s / ref
    return df


def lost_updates(
    client: Client, config: CountingConfig, densities: Sequence[float], locks: Sequence[bool] = (False, True)
) -> pd.DataFrame:
    """The counting experiment at each density: intended increments, landed ones, and the fraction lost."""
    rows = []
    for density in densities:
        for lock in locks:
            r = run_counting(config.replace(density=float(density), lock=lock), client)
            rows.append({k: r.summary[k] for k in ("density", "lock", "workers", "intended", "landed", "lost",
                                                    "lost_fraction", "updates_per_s")})
    return pd.DataFrame(rows)


def oversubscription(
    client: Client, config: HogwildConfig, threads: Sequence[int] = (1, 2, 4, 8), locks: Sequence[bool] = (False, True)
) -> pd.DataFrame:
    """Threads inside one worker process against the machine's cores: throughput stops growing past the cores."""
    rows = []
    for n in threads:
        for lock in locks:
            r = run_hogwild(config.replace(backend="threads", workers=n, lock=lock), client)
            rows.append(_row(r, threads=n, cores=cpu_count()))
    df = pd.DataFrame(rows).drop(columns=["workers"])
    ref = df[(df.threads == min(threads)) & (~df.lock)].updates_per_s.max()
    df["speedup"] = df.updates_per_s / ref
    return df
