"""Benchmark for the transformer chapter: the course's all-to-all (pairwise exchange over Comm) against torch's.

The same ranks of one gloo group run, turn about, `collectives.all_to_all.all_to_all` and
`torch.distributed.all_to_all_single` on the same input, with the uneven splits a mixture of experts' dispatch has
(rows of h = 256 fp32 features, each rank sending a different, seeded number of rows to each rank, about MIB_PER_RANK
MiB in all). Each turn (CALLS calls in a row) starts after a barrier; the figure to quote is the paired ratio (ours
over torch's in the same round, median over rounds and ranks): all_to_all_vs_torch_{N}ranks_ratio, goal <= 1.1. The
ranks are not pinned to cores, as chapter 10's are not: pinned, each rank's own thread and its gloo threads share one
core, which cost the course's exchange 1.3-1.6 times torch's single call at 2 ranks.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
import torch.distributed as dist

from ..collectives.all_to_all import all_to_all, library_all_to_all
from ..runtime.ranks.comm import Comm
from ..runtime.ranks.group import plan_group, run_in_group
from ..trace import TraceRecorder
from .runner import with_client

WIDTH = 256
MIB_PER_RANK = 4
#: Calls timed together after each barrier: the ranks leave a barrier a little apart, and a single call's time
#: carries that skew (it made the paired ratio swing from 0.95 to 1.26 between runs at 2 ranks).
CALLS = 4


def uneven_splits(world: int, seed: int) -> list[list[int]]:
    """splits[i][j]: rows rank i sends rank j, uneven (between half and 1.5 times the mean), seeded."""
    g = torch.Generator().manual_seed(seed)
    mean = MIB_PER_RANK * 2**20 // (4 * WIDTH) // world
    return (mean // 2 + torch.randint(0, mean + 1, (world, world), generator=g)).tolist()


def _rank(ctx: Any, comm: Comm, splits: list[list[int]], rounds: int) -> list[tuple[float, float]]:
    """(ours, torch's) seconds per call on this rank in each round (CALLS in a row), after two warm-up rounds."""
    torch.set_num_threads(1)
    r = comm.rank
    send, recv = splits[r], [row[r] for row in splits]
    x = torch.randn(sum(send), WIDTH, generator=torch.Generator().manual_seed(r))
    if not torch.equal(all_to_all(comm, x, send, recv), library_all_to_all(comm, x, send, recv)):
        raise RuntimeError("the course's all-to-all differs from all_to_all_single")
    times = []
    for i in range(rounds + 2):
        pair = []
        for which in ((all_to_all, library_all_to_all) if i % 2 else (library_all_to_all, all_to_all)):
            dist.barrier()
            t = time.perf_counter()
            for _ in range(CALLS):
                which(comm, x, send, recv)
            pair.append((which is all_to_all, (time.perf_counter() - t) / CALLS))
        comm.take_log()
        if i >= 2:
            times.append((dict(pair)[True], dict(pair)[False]))
    return times


def _measure(client: Any, world: int, rounds: int) -> dict[str, float]:
    """Median paired ratio and median times (ms) over `rounds` rounds on `world` ranks."""
    spec = plan_group(client, world, device="cpu", timeout_s=60.0)  # unpinned, as the chapter's ranks run
    splits = uneven_splits(world, seed=world)
    per_rank, _ = run_in_group(client, spec, _rank, [(splits, rounds)] * world, TraceRecorder(), run_timeout_s=600)
    pairs = [p for rank in per_rank for p in rank]
    return {"ratio": statistics.median(o / t for o, t in pairs),
            "ours_ms": statistics.median(o for o, _ in pairs) * 1e3,
            "torch_ms": statistics.median(t for _, t in pairs) * 1e3}


def measure(rounds: int = 60) -> dict[str, float | str]:
    """2 ranks (quoted) and 4 ranks (information), ours against all_to_all_single in the same group."""
    figures: dict[str, float | str] = {"backend": "gloo", "row_features": float(WIDTH),
                                       "mib_per_rank": float(MIB_PER_RANK)}
    with with_client(2) as client:
        two = _measure(client, 2, rounds)
        client.resize(4)
        four = _measure(client, 4, max(10, rounds // 3))
    for world, got in ((2, two), (4, four)):
        figures[f"all_to_all_ours_{world}ranks_ms"] = round(got["ours_ms"], 3)
        figures[f"all_to_all_torch_{world}ranks_ms"] = round(got["torch_ms"], 3)
        figures[f"all_to_all_vs_torch_{world}ranks_ratio"] = round(got["ratio"], 3)
    return figures


if __name__ == "__main__":
    print(measure())
