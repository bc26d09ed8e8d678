"""Pieces shared by the chapter's experiments: sweep values, the job format, and the run skeleton."""

from __future__ import annotations

from typing import Any

import pandas as pd
from distributed import Client

from ..config import check_float, check_int, check_seed
from ..trace import OnUpdate, TraceRecorder
from .fresh import run_fresh

#: Largest thread / process count a config accepts (clear error beyond it).
MAX_THREADS = 64
#: Memory the matrices of all concurrent processes may take (Binder gives 2 GiB in all).
MEMORY_LIMIT_BYTES = 1024**3


def counts(maximum: int) -> list[int]:
    """Sweep values 1..maximum: every count up to 4, then powers of two, and maximum itself."""
    values = set(range(1, min(maximum, 4) + 1)) | {2**k for k in range(10) if 2**k <= maximum} | {maximum}
    return sorted(values)


def check_common(config: Any) -> None:
    """Validate the fields every thread experiment has: repeats, warmup, seed, timeout_s."""
    check_int("repeats", config.repeats, 1, 100)
    check_int("warmup", config.warmup, 0, 20)
    check_seed(config.seed)
    check_float("timeout_s", config.timeout_s, 5.0, 600.0)


def check_optional_count(name: str, value: int | None) -> None:
    """None means 'all cores of the worker'; otherwise an int in [1, MAX_THREADS]."""
    if value is not None:
        check_int(name, value, 1, MAX_THREADS)


def check_memory(processes: int, size: int) -> None:
    """Refuse grids whose matrices would not fit: processes x 3 size^2 float32 must stay under the limit."""
    need = processes * 3 * size * size * 4
    if need > MEMORY_LIMIT_BYTES:
        raise ValueError(
            f"processes={processes} with size={size} needs about {need / 2**20:.0f} MiB of matrices "
            f"(limit {MEMORY_LIMIT_BYTES / 2**20:.0f} MiB); lower processes or size"
        )


def job(intra: int, inter: int, processes: int, suite: dict[str, Any]) -> dict[str, Any]:
    """One configuration for the zygote: pool sizes, process count, and what to build and time."""
    return {"intra": intra, "inter": inter, "processes": processes, "suite": suite}


def suite(config: Any, *, ops: tuple[str, ...] = (), size: int = 64, towers: dict | None = None,
          streams: dict | None = None) -> dict[str, Any]:
    """The work description sent to each fresh process."""
    return {
        "ops": list(ops), "size": size, "towers": towers, "streams": streams,
        "repeats": config.repeats, "warmup": config.warmup, "seed": config.seed,
    }


def run_jobs(
    client: Client, jobs: list[dict[str, Any]], on_update: OnUpdate | None, timeout_s: float
) -> tuple[pd.DataFrame, bool, dict[str, Any] | None]:
    """Run the configurations in fresh processes on the first worker; (trace, stopped, worker info)."""
    recorder = TraceRecorder(on_update)
    info, stopped = run_fresh(client, jobs, recorder, timeout_s)
    return recorder.frame(), stopped, info


def timed(trace: pd.DataFrame) -> pd.DataFrame:
    """The measurement rows that carry a timing (demonstrations and skips have none)."""
    if "seconds" not in trace.columns:
        return trace.iloc[0:0]
    return trace[(trace.event == "measure") & trace.seconds.notna()]


def per_config(trace: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Median over processes of each configuration's median seconds, with the settings that were in effect."""
    rows = timed(trace)
    if not len(rows):
        return pd.DataFrame(columns=[*keys, "seconds", "num_threads", "num_interop_threads", "pids"])
    grouped = rows.groupby(keys, sort=True)
    out = grouped.agg(
        seconds=("seconds", "median"),
        num_threads=("num_threads", "first"),
        num_interop_threads=("num_interop_threads", "first"),
        pids=("pid", "nunique"),
    )
    return out.reset_index()
