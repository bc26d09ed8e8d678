"""What every simulated run shares: the SimPy environment, the trace in simulated seconds, real gradients.

Simulated time stands in for wall-clock time in the trace's `time` column, so the chapters' plots read a
simulated trace unchanged. In mode="real" the workers compute true minibatch gradients of the chapter's model
(the same shards and batch_indices as on the cluster) at the moments the simulation says they do.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import simpy

from ..models import loss_and_grad
from ..problem import Problem, get_problem
from ..sampling import batch_indices
from ..syncasync.settings import EvalRecorder
from ..trace import OnUpdate
from .config import SimConfig
from .delays import SimDelays, delays_of
from .network import ITEMSIZE, AlphaBetaNet


class SimClock(EvalRecorder):
    """A trace recorder whose default `time` is the simulation's clock; snapshots (`params`) become evals."""

    def __init__(self, env: simpy.Environment, problem: Problem | None, on_update: OnUpdate | None) -> None:
        super().__init__(problem, on_update)  # type: ignore[arg-type]
        self.t0 = 0.0
        self.env = env

    def record(self, **event: Any) -> dict[str, Any]:
        event.setdefault("time", float(self.env.now))
        return super().record(**event)


class Gradients:
    """Real minibatch gradients for the simulated workers: rank's shard, batch_indices(seed + rank)."""

    def __init__(self, config: SimConfig) -> None:
        self.problem = get_problem(config.problem)
        self.config = config
        self._shards: dict[int, Any] = {}

    def __call__(self, rank: int, step: int, w: np.ndarray) -> tuple[float, np.ndarray, int]:
        """(loss, gradient, rows) of rank's minibatch number `step` at parameters w."""
        shard = self._shards.get(rank)
        if shard is None:
            shard = self._shards[rank] = self.problem.train_shard(rank, self.config.world)
        idx = batch_indices(shard.n_samples, self.config.batch_size, step, self.config.seed + rank)
        loss, grad = loss_and_grad(self.problem.model, w, shard.X[idx], shard.y[idx])
        return float(loss), grad, len(idx)


class SimRun:
    """State common to the simulated algorithms: environment, trace, network, delays, parameters."""

    def __init__(self, config: SimConfig, on_update: OnUpdate | None) -> None:
        self.config = config
        self.env = simpy.Environment()
        self.real = config.mode == "real"
        self.grads = Gradients(config) if self.real else None
        problem = self.grads.problem if self.grads is not None else None
        self.trace = SimClock(self.env, problem, on_update)
        self.net = AlphaBetaNet(config.alpha_s, config.bandwidth_Bps)
        self.delays: SimDelays = delays_of(config)
        self.w = problem.init_params.astype(np.float32, copy=True) if problem is not None else None
        self.elements = config.elements if config.elements is not None else n_params(config)
        self.param_bytes = self.elements * ITEMSIZE

    def snapshot_due(self, version: int, last: int) -> bool:
        """Is an evaluation due after `version` updates (every eval_every, and at the end)?"""
        return self.real and (version % self.config.eval_every == 0 or version == last)

    def run(self) -> None:
        """Run the simulation until every process has finished (StopRequested propagates to the caller)."""
        self.env.run()


def n_params(config: SimConfig) -> int:
    """Length of the model's flat parameter vector (what a gradient or a pull moves)."""
    return int(get_problem(config.problem).init_params.size)
