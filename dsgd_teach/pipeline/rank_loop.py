"""One stage's training loop for the flushed pipelines (naive, GPipe, 1F1B): the schedule's step, then SGD.

Each step takes the batch, runs the schedule's `train_step` loop (naive.py, gpipe.py, one_f_one_b.py) on the Stage
of engine.py, adds the gradients up over the replicas (hybrid parallelism), and updates. `stage_staleness` > 0
applies each gradient that many steps late (the decoupled schedule's arithmetic with a flush every step).
"""

from __future__ import annotations

from collections import deque
from typing import Any

import torch
from torch import nn

from ..runtime.ranks.comm import Comm
from ..runtime.ranks.live import WorkerContext
from . import gpipe, naive, one_f_one_b
from .actions import TrainStep, actions_of
from .engine import Stage
from .stages import flat_grads, flat_params

TRAIN_STEPS: dict[str, TrainStep] = {"naive": naive.train_step, "gpipe": gpipe.train_step,
                                     "1f1b": one_f_one_b.train_step, "decoupled": gpipe.train_step}


def pipeline_rank(ctx: WorkerContext, comm: Comm, config: Any) -> dict[str, Any]:
    """One stage of one replica: train config.steps steps with config.schedule's loop; returns its parameters."""
    stage = Stage(ctx, comm, config)
    train_step = TRAIN_STEPS[config.schedule]
    actions = actions_of(train_step, stage.p, config.microbatches, stage.s)
    staleness = config.stage_staleness(stage.s)
    waiting: deque[list[torch.Tensor]] = deque()  # gradients computed but not yet applied (decoupled only)
    stopped = False
    for step in range(config.steps):
        stage.begin_step(step, actions)
        stage.module.zero_grad(set_to_none=True)
        train_step(stage, stage.p, config.microbatches, stage.s)
        stage.finish_sends()
        grads = stage.sum_over_replicas([q.grad if q.grad is not None else torch.zeros_like(q)
                                         for q in stage.module.parameters()])
        applied = _update(stage.module, grads, waiting, staleness, config.lr)
        stage.report_update(step - staleness, staleness, applied)
        if stage.agree_to_stop():
            stopped = True
            break
    stage.close()
    return {"stage": stage.s, "replica": stage.layout.replica, "params": flat_params(stage.module),
            "grads": flat_grads(stage.module), "peak_held": stage.peak, "stopped": stopped, "staleness": staleness}


@torch.no_grad()
def _update(module: nn.Module, grads: list[torch.Tensor], waiting: deque[list[torch.Tensor]], staleness: int,
            lr: float) -> bool:
    """SGD with the gradient computed `staleness` steps ago (0: this step's); False while none is old enough."""
    params = list(module.parameters())
    waiting.append(grads)  # fresh tensors each step (zero_grad sets .grad to None), so no copy is needed
    if len(waiting) <= staleness:
        return False
    for p, g in zip(params, waiting.popleft(), strict=True):
        p.add_(g, alpha=-lr)  # one pass, no temporary the size of the parameter
    return True
