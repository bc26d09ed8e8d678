"""Intra-op parallelism: how one matmul / convolution / MLP step speeds up with more threads inside the op.

TensorFlow's `intra_op_parallelism_threads` and PyTorch's `torch.set_num_threads` size the same thing: the pool
that splits one kernel (rows of a matmul, output channels of a convolution) across cores. Each thread count
runs in its own fresh process; the speedup is t(1 thread) / t(T threads), ideally T while T <= cores.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
from distributed import Client

from ..config import Config, check_choice, check_int
from ..trace import OnUpdate, Result
from .common import check_common, check_optional_count, counts, job, per_config, run_jobs, suite
from .fresh import worker_cores
from .workloads import OPS


@dataclass(frozen=True)
class IntraOpConfig(Config):
    """Time `ops` on size-n inputs with 1..max_threads intra-op threads (None: all cores of the worker)."""

    ops: tuple[str, ...] = OPS
    max_threads: int | None = None
    size: int = 1024
    repeats: int = 7
    warmup: int = 2
    seed: int = 0
    timeout_s: float = 180.0

    def __post_init__(self) -> None:
        if isinstance(self.ops, str):  # "matmul,conv" from the command line
            object.__setattr__(self, "ops", tuple(op.strip() for op in self.ops.split(",") if op.strip()))
        super().__post_init__()

    def validate(self) -> None:
        if not isinstance(self.ops, tuple) or not self.ops:
            raise ValueError(f"ops must be a non-empty tuple drawn from {OPS}, got {self.ops!r}")
        for op in self.ops:
            check_choice("ops", op, OPS)
        if len(set(self.ops)) != len(self.ops):
            raise ValueError(f"ops must not repeat an op, got {self.ops!r}")
        check_optional_count("max_threads", self.max_threads)
        check_int("size", self.size, 16, 4096)
        check_common(self)


def intra_table(trace: pd.DataFrame) -> pd.DataFrame:
    """One row per (op, threads): median seconds, speedup over 1 thread, the ideal, settings in effect."""
    table = per_config(trace, ["workload", "intra_threads"])
    if not len(table):
        return table.assign(speedup=[], ideal=[])
    base = table[table.intra_threads == 1].set_index("workload").seconds
    table["speedup"] = table.workload.map(base) / table.seconds
    table["ideal"] = table.intra_threads.astype(float)
    return table.rename(columns={"workload": "op", "intra_threads": "threads"})


def run_intra_op(config: IntraOpConfig, client: Client, on_update: OnUpdate | None = None) -> Result:
    """Measure each op at every thread count, one fresh process per count, on the cluster's first worker."""
    cores = worker_cores(client)
    max_threads = config.max_threads or cores
    work = suite(config, ops=config.ops, size=config.size)
    jobs = [job(t, 1, 1, work) for t in counts(max_threads)]
    trace, stopped, _ = run_jobs(client, jobs, on_update, config.timeout_s)
    table = intra_table(trace)
    summary: dict[str, float] = {"cores": float(cores), "configs": float(table.threads.nunique() if len(table) else 0)}
    for row in table.itertuples():
        if row.threads == 1:
            summary[f"{row.op}_ms_1t"] = row.seconds * 1e3
        else:
            summary[f"{row.op}_speedup_{row.threads}t"] = float(row.speedup)
    return Result(config, trace, summary, None, stopped)
