"""CUDA streams on a GPU worker: independent chains on one stream vs one stream each (skipped without CUDA)."""

from __future__ import annotations

from dataclasses import dataclass

from distributed import Client

from ..config import Config, check_int
from ..trace import OnUpdate, Result, TraceRecorder
from .common import check_common, job, per_config, run_jobs, suite
from .fresh import worker_has_cuda


@dataclass(frozen=True)
class StreamsConfig(Config):
    """`chains` independent chains of `depth` size x size matmuls, timed on the default stream vs separate streams."""

    chains: int = 4
    size: int = 256
    depth: int = 8
    repeats: int = 5
    warmup: int = 2
    seed: int = 0
    timeout_s: float = 120.0

    def validate(self) -> None:
        check_int("chains", self.chains, 1, 32)
        check_int("size", self.size, 16, 8192)
        check_int("depth", self.depth, 1, 256)
        check_common(self)


def run_streams(config: StreamsConfig, client: Client, on_update: OnUpdate | None = None) -> Result:
    """Measure on the first worker's GPU in a fresh process; without CUDA, a one-event 'skipped' result."""
    if not worker_has_cuda(client):
        recorder = TraceRecorder(on_update)
        recorder.record(event="skipped", workload="streams", reason="no CUDA device on the worker")
        return Result(config, recorder.frame(), {"skipped": 1.0}, None, False)
    streams = {"size": config.size, "chains": config.chains, "depth": config.depth}
    trace, stopped, _ = run_jobs(client, [job(1, 1, 1, suite(config, streams=streams))], on_update, config.timeout_s)
    table = per_config(trace, ["variant"]).set_index("variant")
    summary: dict[str, float] = {"skipped": 0.0}
    if {"default_stream", "streams"} <= set(table.index):
        summary["default_stream_ms"] = float(table.seconds["default_stream"] * 1e3)
        summary["streams_ms"] = float(table.seconds["streams"] * 1e3)
        summary["streams_speedup"] = float(table.seconds["default_stream"] / table.seconds["streams"])
        summary["max_abs_diff"] = float(trace.max_abs_diff.max())
    return Result(config, trace, summary, None, stopped)
