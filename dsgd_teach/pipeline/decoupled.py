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
import torch.distributed as dist
from torch import nn

from ..collectives.comm import Comm
from ..live import WorkerContext
from ..sampling import batch_indices
from .hybrid import Layout, average_replicas, data_parallel_groups
from .link import StageLink
from .rank_support import agree_to_stop, ctx_now, device_sync, emulate_device, training_data
from .stages import boundary_shapes, build_units, flat_params, microbatch_slices, stage_module


def decoupled_rank(ctx: WorkerContext, comm: Comm, config: Any) -> dict[str, Any]:
    """One stage of one replica: each step, forwards of this step's batch, then the backward of an older one."""
    layout = Layout(config.stages, config.replicas, comm.rank)
    p, s, dev, delay, m = config.stages, layout.stage, comm.device, config.gradient_delay, config.microbatches
    dp_groups = data_parallel_groups(layout)
    first, last = s == 0, s == p - 1
    X_all, y_all = training_data(config)
    units = build_units(config.model, X_all.shape[1], 10, config.depth, config.hidden, config.seed)
    module: nn.Module = stage_module(units, p, s).to(dev)
    shapes = boundary_shapes(units, p, X_all.shape[1])
    lag = config.stage_staleness(s)  # this stage back-propagates the batch of step t - lag
    link = StageLink(s, dev, config.timeout_s)
    prev, nxt = layout.peer(s - 1) if s > 0 else -1, layout.peer(s + 1) if s < p - 1 else -1
    # step -> (its microbatches' (input, output) graphs, the parameters their forward used)
    pending: dict[int, tuple[dict[int, tuple[torch.Tensor, torch.Tensor]], list[nn.Parameter]]] = {}
    last_grads: list[torch.Tensor] = [torch.zeros_like(q) for q in module.parameters()]
    peak, stopped, step = 0, False, -1
    for step in range(config.steps):
        batch = batch_indices(len(y_all), config.batch_size, step, config.seed)
        idx = layout.replica_rows(batch)
        X, y = torch.as_tensor(X_all[idx], device=dev), torch.as_tensor(y_all[idx], device=dev)
        slices = microbatch_slices(len(idx), m)
        old = step - lag  # the batch whose backward this stage runs now (none while the pipeline warms up)
        link.plan(_receives(slices, shapes, s, prev, nxt, old >= 0 and not last))
        graphs: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        pending[step] = (graphs, list(module.parameters()))
        loss_sum = 0.0
        for k, rows in enumerate(slices):  # forwards: as in GPipe, microbatch k follows k-1 down the stages
            if first:
                x = X[rows]
            else:
                x, wait = link.recv((rows.stop - rows.start, *shapes[s]), prev, f"activation of microbatch {k}")
                ctx.emit(step=step, event="idle", microbatch=k, duration=wait, t_start=ctx_now(ctx) - wait)
                x.requires_grad_(True)
            t = ctx_now(ctx)
            out = module(x)
            if last:
                out = nn.functional.cross_entropy(out, y[rows], reduction="sum") / len(batch)
                loss_sum += float(out.item())
            device_sync(dev)
            emulated = emulate_device(t, config.emulated_forward_s, ctx)
            graphs[k] = (x, out)
            held = sum(len(g) for g, _ in pending.values())
            peak = max(peak, held)
            ctx.emit(step=step, event="forward", microbatch=k, t_start=t, duration=ctx_now(ctx) - t, held=held,
                     **emulated)
            if not last:
                sent = link.send(out, nxt, f"activation of microbatch {k}", due=step)
                ctx.emit(step=step, event="send", microbatch=k, peer=nxt, bytes_sent=sent)
        if old >= 0:
            last_grads = _backward_old_batch(ctx, link, pending.pop(old), step, old, m, (s, prev, nxt, delay),
                                             config.steps, config.backward_device_s)
            if dp_groups:  # hybrid: the replicas of this stage add up their gradients (and the loss)
                for q, g in zip(module.parameters(), last_grads, strict=True):
                    q.grad = g
                loss_sum, sent = average_replicas(comm, module, dp_groups[s], loss_sum)
                last_grads = [q.grad for q in module.parameters()]
                ctx.emit(step=step, event="allreduce", bytes_sent=sent, stage=s)
            _step_out_of_place(module, last_grads, config.lr)
            if last and layout.replica == 0:
                ctx.emit(step=step, event="update", loss=loss_sum, version_read=old, version_applied=step + 1,
                         staleness=lag)
            else:
                ctx.emit(step=step, event="stage_update", version_read=old, staleness=lag)
        link.finish(step)
        if agree_to_stop(comm, ctx.should_stop()):
            stopped = True
            break
    _drain(link, pending, step, config.steps, nxt, lag, delay)
    link.finish()
    for group in dp_groups:
        dist.destroy_process_group(group)
    return {"stage": s, "replica": layout.replica, "params": flat_params(module),
            "grads": torch.cat([g.reshape(-1) for g in last_grads]).cpu().numpy() if last_grads else
            flat_params(module)[:0], "peak_held": peak, "stopped": stopped, "staleness": lag}


def _backward_old_batch(ctx: WorkerContext, link: StageLink, pending: tuple[dict, list[nn.Parameter]], step: int,
                        old: int, m: int, where: tuple[int, int, int, int], steps: int,
                        device_s: float = 0.0) -> list[torch.Tensor]:
    """Back-propagate the batch of step `old` through the weights its forward used; its parameter gradient."""
    s, prev, nxt, delay = where
    graphs, params = pending
    for q in params:  # these objects may also hold an older batch's gradient (no update came in between)
        q.grad = None
    for k in reversed(range(m)):
        x, out = graphs.pop(k)
        grad = None
        if nxt >= 0:  # sent by the next stage `delay` steps ago: it is already here, nobody waits
            grad, wait = link.recv(tuple(out.shape), nxt, f"gradient of microbatch {k}")
            ctx.emit(step=step, event="idle", microbatch=k, duration=wait, t_start=ctx_now(ctx) - wait)
        t = ctx_now(ctx)
        out.backward(grad)  # accumulates into the stashed parameters' .grad (and x.grad), as in GPipe
        device_sync(x.device)
        emulated = emulate_device(t, device_s, ctx)
        ctx.emit(step=step, event="backward", microbatch=k, t_start=t, duration=ctx_now(ctx) - t, batch=old,
                 held=len(graphs), **emulated)
        if prev >= 0 and step + delay < steps:  # the previous stage uses it `delay` steps from now
            sent = link.send(x.grad, prev, f"gradient of microbatch {k}", due=step + delay)
            ctx.emit(step=step, event="send", microbatch=k, peer=prev, bytes_sent=sent)
    total = [q.grad if q.grad is not None else torch.zeros_like(q) for q in params]
    for q in params:
        q.grad = None
    return total


@torch.no_grad()
def _step_out_of_place(module: nn.Module, grads: list[torch.Tensor], lr: float) -> None:
    """SGD step that gives every parameter new storage, so graphs of batches still in flight keep the old one."""
    it = iter(grads)
    for sub in module.modules():
        for name, q in list(sub._parameters.items()):
            if q is not None:
                setattr(sub, name, nn.Parameter(q - lr * next(it)))


def _receives(slices: list[slice], shapes: list[tuple[int, ...]], s: int, prev: int, nxt: int,
              backward: bool) -> list[tuple[tuple[int, ...], int, str]]:
    """This step's messages in the order the stage asks: activations (forwards), then gradients (backwards)."""
    out = [((sl.stop - sl.start, *shapes[s]), prev, f"activation of microbatch {k}")
           for k, sl in enumerate(slices) if prev >= 0]
    if backward:
        out += [((slices[k].stop - slices[k].start, *shapes[s + 1]), nxt, f"gradient of microbatch {k}")
                for k in reversed(range(len(slices)))]
    return out


def _drain(link: StageLink, pending: dict[int, tuple[dict, list[nn.Parameter]]], stopped_at: int, steps: int,
           nxt: int, lag: int, delay: int) -> None:
    """After an early stop, receive the gradients the next stage already sent for steps that will not come."""
    if nxt < 0:
        return
    for step in range(stopped_at + 1, min(stopped_at + delay, steps - 1) + 1):
        graphs, _params = pending.get(step - lag, ({}, []))
        for k in sorted(graphs, reverse=True):
            link.recv(tuple(graphs[k][1].shape), nxt, f"gradient of microbatch {k}")
