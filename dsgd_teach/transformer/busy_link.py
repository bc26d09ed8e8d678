"""The latency a training step's messages meet: α of chapter 05's ring among N ranks that compute between messages.

An idle ping-pong (chapter 05) measures the wire: each rank waits for the message with nothing else to do. In a
training step the ranks compute between collectives, and when N ranks share fewer cores, or the machine runs other
work, a rank that waits for a message has given its core away and waits again to get it back. That wait is part of
every message a step sends, so the calibration measures it the same way: N ranks, each computing for `gap_s` (about
what a layer computes between two of its collectives) before every small ring allreduce; the slowest rank's median
time per message, less what the idle link's β charges for its bytes, is the busy α. The wire's β stays the idle
ping-pong's: waiting costs time per message, not per byte.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
from distributed import Client

from ..collectives.algorithms import ring_allreduce
from ..runtime.ranks import run_group
from ..runtime.ranks.comm import Comm

#: Elements of the ring allreduce timed (a small model's activation: its time is nearly all latency).
ELEMENTS = 1024


def busy_ring_rank(ctx: Any, comm: Comm, elements: int, gap_s: float, repeats: int) -> float:
    """Median seconds of a ring allreduce of `elements` on this rank, each after gap_s of matmuls."""
    torch.set_num_threads(1)
    a, x = torch.randn(64, 64), torch.randn(elements)
    times = []
    for _ in range(repeats + 2):  # two warm-up calls
        start = time.perf_counter()
        while time.perf_counter() - start < gap_s:
            a @ a
        t = time.perf_counter()
        ring_allreduce(comm, x)
        times.append(time.perf_counter() - t)
    comm.take_log()
    return statistics.median(times[2:])


def measure_busy_alpha(client: Client, ranks: int, gap_s: float, beta: float = 0.0, timeout_s: float = 60.0,
                       repeats: int = 30, elements: int = ELEMENTS) -> float:
    """Seconds per message among `ranks` busy ranks: a ring allreduce is 2(N-1) messages of K/N elements."""
    run = run_group(client, ranks, busy_ring_rank, (elements, gap_s, repeats), timeout_s=timeout_s,
                    run_timeout_s=10 * timeout_s)
    if len(run.done) < ranks:
        raise RuntimeError(f"the busy link among {ranks} ranks was not measured: the run was stopped")
    per_message_s = max(run.done) / (2 * (ranks - 1))
    return max(0.0, per_message_s - beta * 4 * elements / ranks)
