"""Benchmark for chapter 05: bus bandwidth of the hand-written ring against the library's all_reduce, 16 MiB.

Both run in the same process group, interleaved (ring, library, ring, library), so machine noise hits both
alike; the figure to quote is ring_vs_library_2ranks_ratio (goal >= 0.7). Four ranks are for information.
"""

from __future__ import annotations

import statistics
from typing import Any

from ..collectives.cost_model import bus_bandwidth
from ..collectives.experiment import run_session
from ..collectives.session import Plan
from .runner import with_client

NBYTES = 16 * 1024 * 1024


def _busbw(world: int, client: Any, repeats: int, rounds: int) -> dict[str, Any]:
    """Median bus bandwidth (GB/s) of ring and library at NBYTES over `world` ranks, interleaved `rounds` times."""
    k = NBYTES // 4
    plan = Plan(jobs=(("ring", k), ("library", k)) * rounds, repeats=repeats, warmup=1, seed=0)
    spec, _, trace, _ = run_session(client, world, plan, device="auto", timeout_s=60, run_timeout_s=300)
    timed = trace[(trace.event == "allreduce") & (trace.worker == 0)]
    out = {"backend": spec.backend}
    for algorithm in ("ring", "library"):
        seconds = statistics.median(timed[timed.algorithm == algorithm].slowest_seconds)
        out[algorithm] = bus_bandwidth(NBYTES, world, seconds) / 1e9
    return out


def measure() -> dict[str, float | str]:
    """Bus bandwidth at 16 MiB for 2 ranks (quoted) and 4 ranks (information), ring vs library."""
    figures: dict[str, float | str] = {"message_bytes": float(NBYTES)}
    with with_client(2) as client:
        two = _busbw(2, client, repeats=5, rounds=3)
        client.resize(4)
        four = _busbw(4, client, repeats=3, rounds=2)
    for world, bw in ((2, two), (4, four)):
        figures[f"ring_busbw_{world}ranks_GBps"] = round(bw["ring"], 4)
        figures[f"library_busbw_{world}ranks_GBps"] = round(bw["library"], 4)
        figures[f"ring_vs_library_{world}ranks_ratio"] = round(bw["ring"] / bw["library"], 3)
    figures["backend"] = str(two["backend"])
    return figures


if __name__ == "__main__":
    print(measure())
