"""Inter-op parallelism: two independent towers run one after the other, or forked onto the inter-op pool.

TensorFlow's `inter_op_parallelism_threads` runs independent graph nodes at once; in PyTorch the graph is a
TorchScript program and `torch.jit.fork` marks a call that may run on the inter-op pool
(`torch.set_num_interop_threads`). The pool size can be set once per process, so each size gets a fresh one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from distributed import Client

from ..config import Config, check_int
from ..trace import OnUpdate, Result
from .common import check_common, check_optional_count, counts, job, per_config, run_jobs, suite
from .fresh import worker_cores

VARIANTS = ("sequential", "forked", "fork_one")


@dataclass(frozen=True)
class InterOpConfig(Config):
    """Two towers of `depth` Linear(width)+tanh layers on a batch; 1..max_interop_threads pool threads."""

    max_interop_threads: int | None = None
    intra_threads: int = 1
    width: int = 512
    depth: int = 6
    batch: int = 128
    repeats: int = 7
    warmup: int = 3
    seed: int = 0
    timeout_s: float = 180.0

    def validate(self) -> None:
        check_optional_count("max_interop_threads", self.max_interop_threads)
        check_int("intra_threads", self.intra_threads, 1, 64)
        check_int("width", self.width, 8, 4096)
        check_int("depth", self.depth, 1, 64)
        check_int("batch", self.batch, 1, 4096)
        check_common(self)

    def towers(self) -> dict[str, int]:
        return {"width": self.width, "depth": self.depth, "batch": self.batch}


def interop_table(trace: pd.DataFrame) -> pd.DataFrame:
    """One row per (inter-op threads, variant): median seconds and speedup over the sequential variant."""
    rows = trace[trace.workload == "towers"] if "workload" in trace.columns else trace.iloc[0:0]
    table = per_config(rows, ["interop_threads", "variant"])
    if not len(table):
        return table.assign(speedup=[])
    seq = table[table.variant == "sequential"].set_index("interop_threads").seconds
    table["speedup"] = table.interop_threads.map(seq) / table.seconds
    return table


def fork_demos(trace: pd.DataFrame) -> pd.DataFrame:
    """The eager-vs-TorchScript fork demonstrations: call time, done when fork returned, same thread."""
    if "variant" not in trace.columns:
        return pd.DataFrame()
    cols = [c for c in ("interop_threads", "variant", "call_s", "work_s", "done_at_return", "same_thread",
                        "max_abs_diff", "pid") if c in trace.columns]
    return trace[trace.variant.isin(["eager_fork", "script_fork"])][cols].reset_index(drop=True)


def run_inter_op(config: InterOpConfig, client: Client, on_update: OnUpdate | None = None) -> Result:
    """Time the three schedules at each inter-op pool size, one fresh process per size."""
    cores = worker_cores(client)
    top = config.max_interop_threads or cores
    work = suite(config, towers=config.towers())
    jobs = [job(config.intra_threads, i, 1, work) for i in counts(top)]
    trace, stopped, _ = run_jobs(client, jobs, on_update, config.timeout_s)
    table = interop_table(trace)
    summary: dict[str, float] = {"cores": float(cores)}
    for row in table.itertuples():
        if row.variant != "sequential":
            summary[f"{row.variant}_speedup_{row.interop_threads}i"] = float(row.speedup)
    towers = trace[trace.workload == "towers"] if "workload" in trace.columns else trace.iloc[0:0]
    if len(towers):
        summary["max_abs_diff"] = float(np.nanmax(towers.max_abs_diff.to_numpy(dtype=float)))
        demos = fork_demos(trace)
        eager = demos[demos.variant == "eager_fork"]
        if len(eager):
            summary["eager_fork_synchronous"] = float(bool(eager.done_at_return.all() and eager.same_thread.all()))
            summary["eager_fork_call_ms"] = float(eager.call_s.median() * 1e3)
        script = demos[demos.variant == "script_fork"]
        if len(script):
            summary["script_fork_call_ms"] = float(script.call_s.median() * 1e3)
    return Result(config, trace, summary, None, stopped)
