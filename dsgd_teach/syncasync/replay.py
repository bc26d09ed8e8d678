"""Replay an asynchronous run from its trace: the oracle that a server applied each gradient with the delay it saw.

Every push row says which version its gradient read and which update it became. Rebuilding the parameters of each
version, taking each rank's minibatch gradient at the version it read and handing it to a fresh copy of the
server's rule with the same (version_read, version) gives the run's final parameters, when the server did exactly
that. Reads are registered in version order, so rules that remember what a reader saw (AdaRevision's gradient sum,
DC-ASGD's parameters) see them as the server did.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..models import loss_and_grad
from ..problem import get_problem
from ..ps.optimizers import make_optimizer
from ..sampling import batch_indices


def replay_async(config: Any, trace: pd.DataFrame, world: int | None = None) -> np.ndarray:
    """Final parameters of an async run (AsyncConfig or async SimConfig) rebuilt from its trace's push rows."""
    problem = get_problem(config.problem)
    world = world if world is not None else config.world
    pushes = trace[trace.event == "push"].sort_values("version_applied")
    rule = make_optimizer(config.rule, problem.init_params.size, config.dc_lambda)
    readers = pushes.version_read.astype(int).value_counts().to_dict()
    params = [problem.init_params.astype(np.float32)]
    for row in pushes.itertuples():
        v, read = int(row.version_applied) - 1, int(row.version_read)
        if v != len(params) - 1:
            raise ValueError(f"the trace's updates are not consecutive: expected {len(params)}, got {v + 1}")
        for _ in range(readers.get(v, 0)):
            rule.read(v, params[v])
        rank, k = int(row.worker), int(row.step)
        shard = problem.train_shard(rank, world)
        idx = batch_indices(shard.n_samples, config.batch_size, k, config.seed + rank)
        _, grad = loss_and_grad(problem.model, params[read], shard.X[idx], shard.y[idx])
        params.append(rule.apply(params[v], grad, config.lr, read, v))
    return params[-1]
