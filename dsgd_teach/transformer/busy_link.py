"""The link a training step's messages meet: α and β of chapter 05's ring among N ranks that compute between messages.

An idle ping-pong (chapter 05) measures the wire: each rank waits for the message with nothing else to do. In a
training step the ranks compute between collectives, and when N ranks share fewer cores, or the machine runs other
work, a rank that waits for a message has given its core away and waits again to get it back; a long message waits
so more than once, as the receiving side reads it in pieces. That is part of every message a step sends, so the
calibration measures it the same way: N ranks, each doing about `gap_s` of matmuls (what a layer computes between two
of its collectives; a fixed amount of work, so that a rank that loses its core arrives late) before every ring
allreduce, at sizes spanning a step's messages (`ELEMENTS`), in rings of each size a mesh axis can have (two rings
of 2 among 4 busy ranks are not one ring of 4: each waits for its partner while the other pair holds the cores).
The slowest rank's mean time per message at each size against the bytes per message gives the busy link for N ranks
and rings of that size: β from chapter 05's α–β fit (not below the idle link's), α what is left per message after
β's share, the median over the sizes.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from distributed import Client

from ..collectives.algorithms import ring_allreduce
from ..collectives.cost_model import AlphaBeta, fit_alpha_beta
from ..runtime.ranks import run_group
from ..runtime.ranks.comm import Comm, wait_for
from .mesh import GroupTransport

#: Elements of the ring allreduces timed: a small activation (its time nearly all latency) up to a model's gradient.
ELEMENTS = (1024, 16_384, 131_072)


def busy_ring_rank(ctx: Any, comm: Comm, groups: tuple[int, ...], sizes: tuple[int, ...], gap_s: float,
                   repeats: int) -> tuple[float, dict[int, list[float]]]:
    """(this rank's compute share, {ring size: seconds per size}): for each ring size in `groups`, the world cut into
    rings of that many consecutive ranks, every ring allreducing at once after about gap_s of matmuls; the seconds a ring
    allreduce of each of `sizes` elements adds to a round on average (`typical`; sizes taken in turn, so that a
    burst of load falls on all of them alike), and how many times longer the matmuls took than at full speed.

    The matmuls are a fixed amount of work, as a layer's: a rank that loses its core meanwhile arrives late and the
    others wait for it, which is part of what a message costs, so a round's time less its typical compute is the
    allreduce's."""
    torch.set_num_threads(1)
    a = torch.randn(64, 64)
    one = matmul_seconds(a)
    matmuls = max(1, round(gap_s / one))
    xs = [torch.randn(k) for k in sizes]
    rounds_by_ring: dict[int, list[list[float]]] = {}
    computes: list[float] = []
    for g in groups:
        first = comm.rank - comm.rank % g
        ring = Comm(comm.rank % g, g, comm.device, comm.timeout_s,
                    transport=GroupTransport(tuple(range(first, first + g)), None))
        rounds: list[list[float]] = [[] for _ in sizes]
        for i in range(repeats + 2):  # two warm-up rounds
            for x, kept in zip(xs, rounds, strict=True):
                t = time.perf_counter()
                for _ in range(matmuls):
                    a @ a
                computed = time.perf_counter()
                ring_allreduce(ring, x)
                if i >= 2:
                    kept.append(time.perf_counter() - t)
                    computes.append(computed - t)
            # the rings meet once a round, as a step's data-axis sum couples a layout's groups
            wait_for(dist.barrier(async_op=True), comm.timeout_s, f"rank {comm.rank}: the busy rings' barrier")
        rounds_by_ring[g] = rounds
    compute_s = typical(computes)
    per_size = {g: [typical(kept) - compute_s for kept in rounds] for g, rounds in rounds_by_ring.items()}
    return compute_s / (matmuls * one), per_size


def typical(seconds: list[float], cut: float = 0.05) -> float:
    """The mean of the timings less the slowest `cut` of them: a step's time is a sum over its messages, so it
    follows their mean, waits for a busy core included; a garbage-collection pause or two is left out."""
    kept = sorted(seconds)[: max(1, round(len(seconds) * (1 - cut)))]
    return statistics.fmean(kept)


def matmul_seconds(a: torch.Tensor, tries: int = 5, count: int = 50) -> float:
    """Seconds of one a @ a on this rank when it has its core: the best of a few timings of `count` in a row."""
    best = float("inf")
    for _ in range(tries):
        t = time.perf_counter()
        for _ in range(count):
            a @ a
        best = min(best, (time.perf_counter() - t) / count)
    return best


def measure_busy_links(client: Client, ranks: int, gap_s: float, floor: AlphaBeta, timeout_s: float = 60.0,
                       repeats: int = 40, sizes: tuple[int, ...] = ELEMENTS) -> tuple[float, dict[int, AlphaBeta]]:
    """(compute share, links) among `ranks` busy ranks: how many times longer a rank's matmuls take than on a core
    of its own (the median rank's), and α and β by the size of the rings they form (2, 4, ... up to `ranks`): a
    ring allreduce of K elements on n ranks is 2(n-1) messages of K/n elements; β is the slope of the slowest rank's
    mean per message against 4K/n bytes (chapter 05's fit), α the median over the sizes of what is left per message.
    Neither is taken below the idle link's (`floor`). Forty rounds per size: with twenty, the 2-rank α of fresh
    clusters ranged 0.87-1.76 ms, and the bench's sweep of 16 layouts came to 11, 14, 13, 16, 14 and 11 within 25 %."""
    groups = tuple(g for g in (2, 4, 8, 16, 32, 64) if g <= ranks and ranks % g == 0)
    run = run_group(client, ranks, busy_ring_rank, (groups, tuple(sizes), gap_s, repeats), timeout_s=timeout_s,
                    run_timeout_s=10 * timeout_s)
    if len(run.done) < ranks:
        raise RuntimeError(f"the busy link among {ranks} ranks was not measured: the run was stopped")
    links = {}
    for g in groups:
        slowest = np.max(np.array([per_size[g] for _, per_size in run.done], dtype=float), axis=0)
        per_message_s = np.maximum(slowest, 1e-9) / (2 * (g - 1))
        per_message_bytes = np.array([4.0 * k / g for k in sizes])
        fitted = fit_alpha_beta(per_message_bytes, per_message_s)
        beta = max(fitted.beta, floor.beta)
        links[g] = AlphaBeta(max(float(np.median(per_message_s - beta * per_message_bytes)), floor.alpha), beta)
    return max(1.0, float(np.median([share for share, _ in run.done]))), links
