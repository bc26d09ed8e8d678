"""One chosen setting (intra-op threads, inter-op threads, problem size, processes) against the 1/1/1 baseline.

What the chapter's widget panel runs: the baseline and the chosen setting each in fresh processes, timing a
matmul and the two-tower model (sequential and forked), so a learner sees what one knob change does.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
from distributed import Client

from ..config import Config, check_int
from ..trace import OnUpdate, Result
from .common import MAX_THREADS, check_common, check_memory, job, per_config, run_jobs, suite
from .fresh import worker_cores


@dataclass(frozen=True)
class ThreadsLabConfig(Config):
    """The setting to compare with one process, one intra-op thread and one inter-op thread."""

    intra_threads: int = 2
    interop_threads: int = 2
    size: int = 512
    processes: int = 1
    repeats: int = 5
    warmup: int = 2
    seed: int = 0
    timeout_s: float = 120.0

    def validate(self) -> None:
        check_int("intra_threads", self.intra_threads, 1, MAX_THREADS)
        check_int("interop_threads", self.interop_threads, 1, MAX_THREADS)
        check_int("size", self.size, 16, 4096)
        check_int("processes", self.processes, 1, 16)
        check_memory(self.processes, self.size)
        check_common(self)

    @property
    def setting(self) -> tuple[int, int, int]:
        return (self.intra_threads, self.interop_threads, self.processes)


def lab_table(trace: pd.DataFrame) -> pd.DataFrame:
    """Median seconds per (setting, workload, variant), setting labelled 'baseline' or 'chosen'."""
    table = per_config(trace, ["step", "workload", "variant"])
    table["setting"] = table.step.map({0: "baseline", 1: "chosen"})
    table["label"] = [f"{w} {v}".strip() for w, v in zip(table.workload, table.variant, strict=True)]
    return table


def run_threads_lab(config: ThreadsLabConfig, client: Client, on_update: OnUpdate | None = None) -> Result:
    """Baseline (1, 1, 1 process) then the chosen setting, each in fresh processes on the first worker."""
    cores = worker_cores(client)
    work = suite(config, ops=("matmul",), size=config.size,
                 towers={"width": max(8, config.size // 2), "depth": 4, "batch": 64})
    jobs = [job(1, 1, 1, work), job(config.intra_threads, config.interop_threads, config.processes, work)]
    trace, stopped, _ = run_jobs(client, jobs, on_update, config.timeout_s)
    table = lab_table(trace)
    t = {(r.setting, r.label): r.seconds for r in table.itertuples()}
    summary: dict[str, float] = {
        "cores": float(cores),
        "total_threads": float(config.processes * config.intra_threads),
        "oversubscribed": float(config.processes * config.intra_threads > cores),
    }
    if ("chosen", "matmul") in t:
        summary["matmul_speedup"] = t[("baseline", "matmul")] / t[("chosen", "matmul")]
        summary["matmul_throughput"] = config.processes * summary["matmul_speedup"]
    if ("chosen", "towers forked") in t:
        summary["towers_forked_speedup"] = t[("baseline", "towers sequential")] / t[("chosen", "towers forked")]
    return Result(config, trace, summary, None, stopped)
