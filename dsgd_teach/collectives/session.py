"""What each rank does inside one process-group session: a ping-pong to fit the link, then timed allreduces.

One session runs a whole plan (several algorithms and sizes) so the group is formed once per run, not per case.
Inputs are drawn from a private generator per (seed, rank, size), so the driver can rebuild them and check sums.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ..runtime.ranks.comm import Comm
from ..runtime.ranks.live import WorkerContext
from .algorithms import get_allreduce, recv_first_exchange


@dataclass(frozen=True)
class Plan:
    """A session's work: (algorithm, elements) jobs timed `repeats` times after `warmup` untimed calls."""

    jobs: tuple[tuple[str, int], ...] = ()
    repeats: int = 3
    warmup: int = 1
    seed: int = 0
    pingpong_sizes: tuple[int, ...] = ()  # bytes; empty: no ping-pong
    pingpong_repeats: int = 5
    emit_messages: bool = False  # stream every message of the first call of each job (for plots)
    return_outputs: bool = False  # send each job's result back to the driver (for checking)


def rank_input(seed: int, rank: int, k: int) -> np.ndarray:
    """The vector rank contributes to an allreduce of length k (same on the driver and on the worker)."""
    return np.random.default_rng([seed, rank, k]).standard_normal(k).astype(np.float32)


def _sync(comm: Comm) -> None:
    if comm.device.type == "cuda":
        torch.cuda.synchronize(comm.device)


def _max_and_stop(comm: Comm, seconds: float, stop: bool) -> tuple[float, bool]:
    """Slowest rank's time and whether any rank was asked to stop (one tiny library allreduce, not timed)."""
    flags = torch.tensor([seconds, 1.0 if stop else 0.0], dtype=torch.float64, device=comm.device)
    if comm.device.type == "cuda":
        flags = flags.float()
    comm.wait_all([dist.all_reduce(flags, op=dist.ReduceOp.MAX, async_op=True)], "the vote on stopping")
    return float(flags[0]), bool(flags[1] > 0)


def pingpong(comm: Comm, sizes: tuple[int, ...], repeats: int) -> list[tuple[int, float]]:
    """(bytes, median one-way seconds) between ranks 0 and 1; other ranks only wait at the barrier."""
    out = []
    for nbytes in sizes:
        buf = torch.zeros(max(1, nbytes // 4), dtype=torch.float32, device=comm.device)
        times = []
        for _ in range(repeats + 1):  # the first round trip warms the connection up
            comm.wait_all([dist.barrier(async_op=True)])
            t = time.perf_counter()
            if comm.rank == 0:
                comm.exchange(buf, 1, step=0, phase="ping")
                comm.exchange(recv=buf, src=1, step=1, phase="pong")
            elif comm.rank == 1:
                comm.exchange(recv=buf, src=0, step=0, phase="ping")
                comm.exchange(buf, 0, step=1, phase="pong")
            _sync(comm)
            times.append((time.perf_counter() - t) / 2)
        comm.take_log()
        out.append((buf.numel() * 4, statistics.median(times[1:])))
    return out


def run_plan(ctx: WorkerContext, comm: Comm, plan: Plan) -> dict[str, Any]:
    """Worker side of a session: ping-pong, then each job; emits timing and message events as it goes."""
    result: dict[str, Any] = {"pingpong": [], "outputs": {}, "messages": [], "stopped": False}
    if plan.pingpong_sizes and comm.world >= 2:
        result["pingpong"] = pingpong(comm, plan.pingpong_sizes, plan.pingpong_repeats)
    for job_no, (algorithm, k) in enumerate(plan.jobs):
        fn = recv_first_exchange if algorithm == "recv-first" else get_allreduce(algorithm)
        x = torch.from_numpy(rank_input(plan.seed, comm.rank, k)).to(comm.device)
        for call in range(plan.warmup + plan.repeats):
            comm.take_log()
            comm.wait_all([dist.barrier(async_op=True)])
            t = time.perf_counter()
            y = fn(comm, x)
            _sync(comm)
            seconds = time.perf_counter() - t
            log = comm.take_log()
            slowest, stop = _max_and_stop(comm, seconds, ctx.should_stop())
            sent = sum(m["bytes"] for m in log if m["direction"] == "send")
            common = {"algorithm": algorithm, "k": k, "nbytes": k * x.element_size(), "job": job_no}
            if call == 0:
                result["messages"].extend({**m, **common} for m in log)
                if plan.return_outputs:
                    result["outputs"][(algorithm, k)] = y.cpu().numpy()
                if plan.emit_messages:
                    for m in log:
                        if m["direction"] == "send":
                            ctx.emit(worker=m["src"], step=m["step"], event="message", bytes_sent=m["bytes"],
                                     peer=m["dst"], phase=m["phase"], chunk=m["chunk"], elements=m["elements"],
                                     **common)
            if call >= plan.warmup:
                ctx.emit(step=call - plan.warmup, event="allreduce", bytes_sent=sent, seconds=seconds,
                         slowest_seconds=slowest, world=comm.world, **common)
            if stop:
                result["stopped"] = True
                return result
    return result
