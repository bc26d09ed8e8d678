"""The link as a training step meets it: α and β of chapter 05's ring among N ranks that compute between messages.

An idle ping-pong (chapter 05) measures the wire: each rank waits for the message with nothing else to do. In a
training step the ranks compute between collectives, and when N ranks share fewer cores, or the machine runs other
work, a rank that waits for a message has given its core away and waits again to get it back. That cost is part of
every message a step sends, so the calibration measures it the same way: N ranks, each doing a small matmul before
every ring allreduce, at two sizes; the slowest rank's median time per message fits α and β (chapter 05's
`fit_alpha_beta`).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np
import torch
from distributed import Client

from ..collectives.algorithms import ring_allreduce
from ..collectives.cost_model import AlphaBeta, fit_alpha_beta
from ..runtime.ranks import run_group
from ..runtime.ranks.comm import Comm

#: Elements of the two allreduces timed (4 KiB and 64 KiB of fp32: a small model's activations).
SIZES = (1024, 16384)
#: The matmul (n × n) each rank computes before every allreduce.
WORK_N = 96


def busy_ring_rank(ctx: Any, comm: Comm, sizes: tuple[int, ...], work_n: int, repeats: int) -> dict[int, float]:
    """Median seconds of a ring allreduce of each size on this rank, each after an n × n matmul."""
    torch.set_num_threads(1)
    a = torch.randn(work_n, work_n)
    out = {}
    for k in sizes:
        x = torch.randn(k)
        times = []
        for _ in range(repeats + 2):  # two warm-up calls
            a @ a
            t = time.perf_counter()
            ring_allreduce(comm, x)
            times.append(time.perf_counter() - t)
        comm.take_log()
        out[k] = statistics.median(times[2:])
    return out


def measure_busy_link(client: Client, ranks: int, timeout_s: float = 60.0, repeats: int = 20,
                      sizes: tuple[int, ...] = SIZES, work_n: int = WORK_N) -> AlphaBeta:
    """α and β per message among `ranks` busy ranks: a ring allreduce of K elements is 2(N-1) messages of K/N."""
    run = run_group(client, ranks, busy_ring_rank, (sizes, work_n, repeats), timeout_s=timeout_s,
                    run_timeout_s=10 * timeout_s)
    per_message_s = [max(out[k] for out in run.outs) / (2 * (ranks - 1)) for k in sizes]
    per_message_bytes = [4 * k / ranks for k in sizes]
    return fit_alpha_beta(np.array(per_message_bytes), np.array(per_message_s))
