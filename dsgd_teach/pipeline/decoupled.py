"""Decoupled parallel backpropagation (Huo et al., 2018): every stage runs its backward without waiting.

In GPipe, stage s cannot start the backward of step t before stage s+1 has finished its own: *backward
locking*. Here the gradient stage s+1 sends back is used one step (`gradient_delay` steps) later. So at step t,
stage s back-propagates the batch of step t - d*(p-1-s) with a gradient that has been waiting since the step
before, and all stages run their backwards at the same time. The last stage is never late.

Each stage keeps the graphs of the batches it has not yet back-propagated, and updates its parameters out of
place, so an old graph still holds the weights its forward used (PipeDream calls this weight stashing). The
arithmetic is therefore exactly "stage s applies, at step t, the gradient of step t - d*(p-1-s)", which
`reference_training` replays in one process; gradient_delay = 0 is the locked pipeline of engine.py.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..runtime.ranks.comm import Comm
from ..runtime.ranks.live import WorkerContext
from .engine import Stage
from .stages import flat_params


def decoupled_rank(ctx: WorkerContext, comm: Comm, config: Any) -> dict[str, Any]:
    """One stage of one replica: each step, forwards of this step's batch, then the backward of an older one."""
    stage = Stage(ctx, comm, config, gradient_delay=config.gradient_delay)
    m, lag = config.microbatches, config.stage_staleness(stage.s)  # this stage back-propagates step t - lag
    forwards = [("F", k) for k in range(m)]
    backwards = [("B", k) for k in reversed(range(m))]
    stashed: dict[int, list[nn.Parameter]] = {}  # step -> the parameters its forwards used
    grads = [torch.zeros_like(q) for q in stage.module.parameters()]
    stopped, step = False, -1
    for step in range(config.steps):
        old = step - lag  # the batch whose backward this stage runs now (none while the pipeline warms up)
        stage.begin_step(step, forwards + (backwards if old >= 0 else []), backward_of=old)
        stashed[step] = list(stage.module.parameters())
        for k in range(m):  # forwards: as in GPipe, microbatch k follows k-1 down the stages
            x = stage.receive_activation(k)
            out = stage.forward(k, x)
            stage.send_activation(k, out)
        if old >= 0:
            params = stashed.pop(old)
            for q in params:  # these objects may also hold an older batch's gradient (no update came in between)
                q.grad = None
            for k in reversed(range(m)):  # backwards of step `old`, through the weights its forwards used
                grad = stage.receive_gradient(k)  # sent by the next stage `delay` steps ago: nobody waits
                grad_in = stage.backward(k, grad)
                stage.send_gradient(k, grad_in)  # the previous stage uses it `delay` steps from now
            grads = [q.grad if q.grad is not None else torch.zeros_like(q) for q in params]
            for q in params:
                q.grad = None
            grads = stage.sum_over_replicas(grads)
            _step_out_of_place(stage.module, grads, config.lr)
            stage.report_update(version_read=old, staleness=lag)
        stage.finish_sends()
        if stage.agree_to_stop():
            stopped = True
            break
    # after an early stop, the gradients the next stage already sent for steps that will not come
    stage.drain_gradients(range(step + 1, min(step + config.gradient_delay, config.steps - 1) + 1), lag)
    stage.close()
    return {"stage": stage.s, "replica": stage.layout.replica, "params": flat_params(stage.module),
            "grads": torch.cat([g.reshape(-1) for g in grads]).cpu().numpy() if grads else
            flat_params(stage.module)[:0], "peak_held": stage.peak, "stopped": stopped, "staleness": lag}


@torch.no_grad()
def _step_out_of_place(module: nn.Module, grads: list[torch.Tensor], lr: float) -> None:
    """SGD step that gives every parameter new storage, so graphs of batches still in flight keep the old one."""
    it = iter(grads)
    for sub in module.modules():
        for name, q in list(sub._parameters.items()):
            if q is not None:
                setattr(sub, name, nn.Parameter(torch.add(q, next(it), alpha=-lr)))
