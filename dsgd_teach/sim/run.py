"""run_simulated: the one entry point, with the same signature and Result as every real run_xxx."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from ..trace import OnUpdate, Result, StopRequested
from .asynchronous import AsyncSim
from .collective import AllreduceSim
from .config import SimConfig, from_config
from .sync import SyncSim

SIMULATORS = {"sync": SyncSim, "async": AsyncSim, "allreduce": AllreduceSim}


@contextmanager
def one_torch_thread(active: bool) -> Iterator[None]:
    """Run the tiny per-worker gradients on one torch thread (restored after): on a busy machine, torch's
    thread pool makes each small gradient dozens of times slower than one thread does."""
    before = torch.get_num_threads()
    if active:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if active:
            torch.set_num_threads(before)


def run_simulated(config: Any, client: Any = None, on_update: OnUpdate | None = None) -> Result:
    """Simulate config (a SimConfig, or any chapter's config via from_config) and return its Result.

    client is accepted so the simulator drops in wherever a real run function goes (widget panels, the CLI); it
    is not used. The trace's `time` is simulated seconds; on_update sees every event as it is simulated and may
    raise StopRequested to end the run early (the result then has stopped=True).
    """
    sim_config = config if isinstance(config, SimConfig) else from_config(config)
    t0 = time.perf_counter()
    sim = SIMULATORS[sim_config.algorithm](sim_config, on_update)
    stopped = False
    with one_torch_thread(sim.real):
        try:
            sim.run()
        except StopRequested:
            stopped = True
    sim.trace.on_update = None
    summary = sim.finish()
    trace = sim.trace.frame()
    if sim.real and "eval" in set(trace.event):
        evals = trace[trace.event == "eval"]
        summary["final_train_loss"] = float(evals.train_loss.iloc[-1])
        summary["final_test_accuracy"] = float(evals.test_accuracy.iloc[-1])
    summary["bytes_sent"] = int(trace.bytes_sent.sum()) if len(trace) else 0
    summary["wall_s"] = time.perf_counter() - t0
    params = getattr(sim, "w_published", getattr(sim, "w", None))
    return Result(sim_config, trace, summary, params, stopped)
