"""Chapter 02 benchmark: Hogwild's speedup from 1 to 2 workers, lock-free against locked, sparse against dense.

Goals from the issue, on 2 cores: sparse speedup 1 -> 2 workers >= 1.8x (ideal 2.0x); lock-free over locked
throughput >= 3x. The dense problem is measured for contrast. Every figure comes from one run of measure(), each
setting repeated and its best throughput kept; numba compilation and data building happen in a warm-up first.
"""

from __future__ import annotations

from typing import Any

from ..cluster import cpu_count
from ..hogwild import CountingConfig, HogwildConfig, run_counting
from ..hogwild.sweeps import scaling, warm
from .runner import with_client

SPARSE = HogwildConfig(dataset="sparse", n_samples=100_000, n_features=20_000, density=0.001, epochs=20,
                       report_every=20_000)
DENSE = HogwildConfig(dataset="dense", n_samples=30_000, n_features=100, epochs=30, report_every=20_000)


def _figures(prefix: str, df: Any) -> dict[str, float]:
    """Throughputs and the two ratios of one problem's scaling table."""
    def rate(workers: int, lock: bool) -> float:
        return float(df[(df.workers == workers) & (df.lock == lock)].updates_per_s.max())

    return {
        f"{prefix}_1w_updates_per_s": round(rate(1, False)),
        f"{prefix}_2w_updates_per_s": round(rate(2, False)),
        f"{prefix}_2w_locked_updates_per_s": round(rate(2, True)),
        f"{prefix}_speedup_1_to_2_ratio": round(rate(2, False) / rate(1, False), 3),
        f"{prefix}_lockfree_over_locked_2w_ratio": round(rate(2, False) / rate(2, True), 3),
    }


def measure(repeats: int = 3) -> dict[str, Any]:
    """Measure everything on a fresh 2-worker cluster; ratios compare settings measured in this same call."""
    out: dict[str, Any] = {"cores": cpu_count()}
    with with_client(2) as client:
        for name, config in (("sparse", SPARSE), ("dense", DENSE)):
            warm(client, config)
            out.update(_figures(name, scaling(client, config, workers=(1, 2), repeats=repeats)))
        threads = SPARSE.replace(backend="threads")
        warm(client, threads)
        out.update(_figures("sparse_threads", scaling(client, threads, workers=(1, 2), repeats=repeats)))
        for density in (0.001, 0.1):
            lost = run_counting(CountingConfig(n_samples=5_000, n_features=1_000, density=density, passes=100), client)
            out[f"count_lost_fraction_density_{density}"] = lost.summary["lost_fraction"]
    return out


if __name__ == "__main__":
    import json

    print(json.dumps(measure(), indent=2))
