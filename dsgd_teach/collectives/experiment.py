"""Configs and run functions for the allreduce experiments: one algorithm at one size, and a timed sweep.

Both form one process group for the whole run, stream every message and timing as trace events, and check the
hand-written results against the exact sum of the inputs (rebuilt on the driver from the same seeds).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from distributed import Client

from ..config import Config, check_choice, check_int, check_seed, check_timeout
from ..runtime.ranks.group import DEVICES, GroupSpec, group_hosts
from ..runtime.ranks.group_run import run_group
from ..trace import OnUpdate, Result, stat
from .algorithms import ALGORITHMS, HAND_WRITTEN, check_algorithm, resolve
from .cost_model import AlphaBeta, bus_bandwidth, fit_alpha_beta, predict_seconds
from .session import Plan, rank_input, run_plan

MAX_ELEMENTS = 16 * 1024 * 1024  # 64 MiB of float32: stays inside a laptop's memory with four ranks


@dataclass(frozen=True)
class PingPong:
    """A run's extras: the two-rank ping-pong timings (bytes, seconds) the alpha-beta model was fitted to."""

    pingpong: pd.DataFrame


@dataclass(frozen=True)
class AllreduceConfig(Config):
    """Allreduce one float32 vector of `elements` over `workers` ranks with `algorithm`, timed `repeats` times."""

    workers: int = 2
    algorithm: str = "ring"
    elements: int = 262_144  # 1 MiB
    repeats: int = 5
    warmup: int = 1
    seed: int = 0
    device: str = "auto"
    timeout_s: float = 30.0
    run_timeout_s: float = 300.0

    def validate(self) -> None:
        check_int("workers", self.workers, 1, 16)
        check_algorithm("algorithm", self.algorithm)
        check_int("elements", self.elements, 0, MAX_ELEMENTS)
        check_int("repeats", self.repeats, 1, 1000)
        check_int("warmup", self.warmup, 0, 100)
        check_seed(self.seed)
        check_choice("device", self.device, DEVICES)
        check_timeout("timeout_s", self.timeout_s)
        check_timeout("run_timeout_s", self.run_timeout_s, 86400.0)


@dataclass(frozen=True)
class SweepConfig(Config):
    """Time `algorithms` (comma-separated) on sizes 2**min_log2_bytes .. 2**max_log2_bytes, and fit alpha-beta."""

    workers: int = 2
    algorithms: str = "naive,doubling,binomial,halving-doubling,ring,library"
    min_log2_bytes: int = 10
    max_log2_bytes: int = 22
    repeats: int = 3
    pingpong_repeats: int = 5
    seed: int = 0
    device: str = "auto"
    timeout_s: float = 30.0
    run_timeout_s: float = 600.0

    def validate(self) -> None:
        check_int("workers", self.workers, 1, 16)
        if not isinstance(self.algorithms, str):
            raise ValueError(f"algorithms must be a comma-separated string of {', '.join(ALGORITHMS)}; got {self.algorithms!r}")
        if not self.algorithm_list:
            raise ValueError(f"algorithms must name at least one of {', '.join(ALGORITHMS)}; got {self.algorithms!r}")
        for name in self.algorithm_list:
            check_algorithm("algorithms", name)
        check_int("min_log2_bytes", self.min_log2_bytes, 2, 26)
        check_int("max_log2_bytes", self.max_log2_bytes, self.min_log2_bytes, 26)
        check_int("repeats", self.repeats, 1, 1000)
        check_int("pingpong_repeats", self.pingpong_repeats, 1, 1000)
        check_seed(self.seed)
        check_choice("device", self.device, DEVICES)
        check_timeout("timeout_s", self.timeout_s)
        check_timeout("run_timeout_s", self.run_timeout_s, 86400.0)

    @property
    def algorithm_list(self) -> tuple[str, ...]:
        return tuple(a.strip() for a in self.algorithms.split(",") if a.strip())

    @property
    def sizes_bytes(self) -> list[int]:
        return [2**j for j in range(self.min_log2_bytes, self.max_log2_bytes + 1)]


def run_session(
    client: Client, world: int, plan: Plan, *, device: str, timeout_s: float, run_timeout_s: float,
    on_update: OnUpdate | None = None,
) -> tuple[GroupSpec, list[dict[str, Any]], pd.DataFrame, bool]:
    """Form a group of `world` ranks, run the plan on every rank, and return (spec, per-rank results, trace, stopped)."""
    run = run_group(client, world, run_plan, (plan,), on_update, device=device, timeout_s=timeout_s,
                    run_timeout_s=run_timeout_s)
    stopped = run.stopped or any(r["stopped"] for r in run.done)
    return run.spec, run.outs, run.trace, stopped


def expected_sum(seed: int, world: int, k: int) -> np.ndarray:
    """The exact (float64) sum of every rank's input: the oracle the allreduces are checked against."""
    return np.sum([rank_input(seed, r, k).astype(np.float64) for r in range(world)], axis=0).reshape(k)


def messages_frame(results: list[dict[str, Any]]) -> pd.DataFrame:
    """Every logged send and receive of every rank (first call of each job) as one DataFrame."""
    rows = [m for r in results if r is not None for m in r["messages"]]
    cols = ["rank", "direction", "src", "dst", "step", "phase", "chunk", "elements", "bytes", "algorithm", "job"]
    return pd.DataFrame(rows, columns=cols) if not rows else pd.DataFrame(rows)


def run_allreduce(config: AllreduceConfig, client: Client, on_update: OnUpdate | None = None) -> Result:
    """One algorithm, one size: every message in the trace, times per repeat, and a check against the sum."""
    t0 = time.perf_counter()
    plan = Plan(jobs=((config.algorithm, config.elements),), repeats=config.repeats, warmup=config.warmup,
                seed=config.seed, emit_messages=True, return_outputs=True)
    spec, results, trace, stopped = run_session(
        client, config.workers, plan, device=config.device, timeout_s=config.timeout_s,
        run_timeout_s=config.run_timeout_s, on_update=on_update,
    )
    outputs = [r["outputs"].get((config.algorithm, config.elements)) for r in results if r is not None]
    truth = expected_sum(config.seed, config.workers, config.elements)
    errors = [float(np.max(np.abs(o - truth), initial=0.0)) for o in outputs if o is not None]
    timed = trace[(trace.event == "allreduce") & (trace.worker == 0)]
    nbytes = config.elements * 4
    median_s = stat(timed, "slowest_seconds")
    sent = messages_frame(results)
    sent = sent[sent.direction == "send"] if len(sent) else sent
    summary = {
        "wall_s": time.perf_counter() - t0,
        "world": config.workers,
        "backend": spec.backend,
        "hosts": group_hosts(spec),
        "port": spec.port,
        "median_ms": median_s * 1e3,
        "busbw_GBps": bus_bandwidth(nbytes, config.workers, median_s) / 1e9,
        "max_bytes_sent_per_rank": float(sent.groupby("rank").bytes.sum().max()) if len(sent) else 0.0,
        "max_abs_error": stat(errors, how="max"),
    }
    return Result(config, trace, summary, outputs[0] if outputs else None, stopped)


def predicted_frame(model: AlphaBeta, world: int, algorithms: tuple[str, ...], sizes_bytes: list[int]) -> pd.DataFrame:
    """alpha-beta predictions for each hand-written algorithm and size (one row each)."""
    rows = [
        {"algorithm": a, "world": world, "nbytes": b, "predicted_seconds": predict_seconds(model, a, world, b // 4)}
        for a in algorithms if resolve(a) in HAND_WRITTEN for b in sizes_bytes
    ]
    return pd.DataFrame(rows, columns=["algorithm", "world", "nbytes", "predicted_seconds"])


def run_sweep(config: SweepConfig, client: Client, on_update: OnUpdate | None = None) -> Result:
    """Fit alpha and beta by ping-pong, then time every algorithm at every size; predictions join the trace."""
    t0 = time.perf_counter()
    sizes = config.sizes_bytes
    # the ping-pong reaches at least 1 MiB, so the bandwidth term is visible even when the sweep stays small
    ping_sizes = tuple(2**j for j in range(config.min_log2_bytes, max(config.max_log2_bytes, 20) + 1, 2))
    plan = Plan(jobs=tuple((a, b // 4) for a in config.algorithm_list for b in sizes), repeats=config.repeats,
                warmup=1, seed=config.seed, pingpong_sizes=ping_sizes, pingpong_repeats=config.pingpong_repeats)
    spec, results, trace, stopped = run_session(
        client, config.workers, plan, device=config.device, timeout_s=config.timeout_s,
        run_timeout_s=config.run_timeout_s, on_update=on_update,
    )
    ping = results[0]["pingpong"] if results and results[0] else []
    summary: dict[str, Any] = {"wall_s": time.perf_counter() - t0, "world": config.workers, "backend": spec.backend,
                               "hosts": group_hosts(spec)}
    if len(ping) >= 2:
        model = fit_alpha_beta(np.array([p[0] for p in ping]), np.array([p[1] for p in ping]))
        summary.update(alpha_us=model.alpha * 1e6, bandwidth_GBps=model.bandwidth / 1e9, beta=model.beta)
        pred = predicted_frame(model, config.workers, config.algorithm_list, sizes).astype({"nbytes": float})
        if len(trace):
            trace = trace.astype({"nbytes": float}).merge(pred.drop(columns="world"), on=["algorithm", "nbytes"], how="left")
    timed = trace[(trace.event == "allreduce") & (trace.worker == 0)] if len(trace) else trace
    for a in config.algorithm_list:
        rows = timed[(timed.algorithm == a) & (timed.nbytes == sizes[-1])] if len(timed) else timed
        if len(rows):
            summary[f"{a}_busbw_GBps"] = bus_bandwidth(sizes[-1], config.workers, float(rows.slowest_seconds.median())) / 1e9
    return Result(config, trace, summary, None, stopped, PingPong(pd.DataFrame(ping, columns=["nbytes", "seconds"])))


def verify_algorithms(
    client: Client, world: int, algorithms: tuple[str, ...], sizes: tuple[int, ...], *, seed: int = 0,
    device: str = "auto", timeout_s: float = 30.0, run_timeout_s: float = 120.0,
) -> tuple[dict[tuple[str, int], list[np.ndarray]], pd.DataFrame, GroupSpec]:
    """Run each algorithm once per size in ONE group session; (outputs per rank, message log, group spec)."""
    plan = Plan(jobs=tuple((a, k) for a in algorithms for k in sizes), repeats=1, warmup=0, seed=seed,
                return_outputs=True)
    spec, results, _, _ = run_session(client, world, plan, device=device, timeout_s=timeout_s,
                                      run_timeout_s=run_timeout_s)
    outputs = {job: [r["outputs"][job] for r in results] for job in plan.jobs}
    return outputs, messages_frame(results), spec
