"""Oversubscription: P processes with T intra-op threads each, all computing at once, against the cores there are.

While P x T <= cores every thread has a core; beyond that they time-slice, and threads that spin while waiting
for each other make it worse than a fair share. Hence the rule the course's clusters follow (and dask workers x
torch threads in every earlier chapter): threads per process = floor(cores / processes).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
from distributed import Client

from ..config import Config, check_int
from ..runtime.clusters.cluster import threads_per_worker_process
from ..trace import OnUpdate, Result, stat
from .common import check_common, check_memory, check_optional_count, counts, job, per_config, run_jobs, suite
from .fresh import worker_cores


@dataclass(frozen=True)
class OversubConfig(Config):
    """Grid of 1..max_processes concurrent processes x 1..max_threads threads (None: all cores), size-n matmuls."""

    max_processes: int = 4
    max_threads: int | None = None
    size: int = 512
    repeats: int = 5
    warmup: int = 2
    seed: int = 0
    timeout_s: float = 180.0

    def validate(self) -> None:
        check_int("max_processes", self.max_processes, 1, 16)
        check_optional_count("max_threads", self.max_threads)
        check_int("size", self.size, 16, 4096)
        check_memory(self.max_processes, self.size)
        check_common(self)


def ideal_throughput(processes: int, threads: int, cores: int) -> float:
    """Work per second relative to one single-threaded process, if threads scaled perfectly: min(P T, cores)."""
    return float(min(processes * threads, cores))


def oversub_table(trace: pd.DataFrame, cores: int) -> pd.DataFrame:
    """One row per (P, T): per-op seconds, slowdown of each op, throughput vs one lone 1-thread process, ideal."""
    table = per_config(trace, ["processes", "intra_threads"])
    if not len(table):
        return table.assign(total_threads=[], slowdown=[], throughput=[], ideal=[], oversubscribed=[], rule=[])
    table = table.rename(columns={"intra_threads": "threads"})
    lone = table[(table.processes == 1) & (table.threads == 1)].seconds
    t11 = stat(lone, how="first")
    table["total_threads"] = table.processes * table.threads
    table["slowdown"] = table.seconds / t11
    table["throughput"] = table.processes * t11 / table.seconds
    table["ideal"] = [ideal_throughput(p, t, cores) for p, t in zip(table.processes, table.threads, strict=True)]
    table["oversubscribed"] = table.total_threads > cores
    table["rule"] = [t == threads_per_worker_process(p, cores) for p, t in zip(table.processes, table.threads, strict=True)]
    return table


def run_oversubscription(config: OversubConfig, client: Client, on_update: OnUpdate | None = None) -> Result:
    """Run every (P, T) of the grid: P fresh processes released together, each timing the same matmul."""
    cores = worker_cores(client)
    work = suite(config, ops=("matmul",), size=config.size)
    grid = [(p, t) for p in counts(config.max_processes) for t in counts(config.max_threads or cores)]
    jobs = [job(t, 1, p, work) for p, t in grid]
    trace, stopped, _ = run_jobs(client, jobs, on_update, config.timeout_s)
    table = oversub_table(trace, cores)
    summary: dict[str, float] = {"cores": float(cores)}
    for row in table.itertuples():
        summary[f"throughput_{row.processes}p{row.threads}t"] = float(row.throughput)
    if len(table):
        best = table.loc[table.throughput.idxmax()]
        summary["best_processes"], summary["best_threads"] = float(best.processes), float(best.threads)
        over = table[table.oversubscribed]
        if len(over):
            summary["worst_shortfall_vs_ideal"] = float((over.ideal / over.throughput).max())
    return Result(config, trace, summary, None, stopped)
