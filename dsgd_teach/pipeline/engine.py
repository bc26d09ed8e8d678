"""What one stage does on its worker: run its schedule's forwards and backwards, talk to its neighbours, update.

The same loop runs every schedule (naive, GPipe, 1F1B): a schedule is only the order of ("F", k) and ("B", k)
actions a stage performs. Every action, wait and message becomes a trace event with its microbatch id, start and
duration, and the number of microbatches whose activations the stage holds, so the plots come from measurement.

Emulated devices (config.emulated_forward_s > 0): a forward or backward still computes for real (the result is
unchanged), then the stage sleeps until the action has lasted the emulated device's time, as if the stage had an
accelerator of its own that takes that long per microbatch. Messages and the schedule stay real. The sleep is not
work and is never passed off as such: each action's trace event carries `compute_s` (measured computation) and
`injected_s` (the sleep), and the plots draw the injected part hatched.
"""

from __future__ import annotations

from collections import deque
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
from .schedules import SCHEDULES
from .stages import boundary_shapes, build_units, flat_grads, flat_params, microbatch_slices, stage_module


def pipeline_rank(ctx: WorkerContext, comm: Comm, config: Any) -> dict[str, Any]:
    """One stage of one replica: train config.steps steps with config.schedule; returns its parameters."""
    layout = Layout(config.stages, config.replicas, comm.rank)
    p, s, dev = config.stages, layout.stage, comm.device
    dp_groups = data_parallel_groups(layout)
    first, last = s == 0, s == p - 1
    X_all, y_all = training_data(config)
    units = build_units(config.model, X_all.shape[1], 10, config.depth, config.hidden, config.seed)
    module: nn.Module = stage_module(units, p, s).to(dev)
    shapes = boundary_shapes(units, p, X_all.shape[1])
    actions = SCHEDULES["gpipe" if config.schedule == "decoupled" else config.schedule](p, config.microbatches, s)
    staleness = config.stage_staleness(s)
    waiting: deque[list[torch.Tensor]] = deque()  # gradients computed but not yet applied (decoupled only)
    link = StageLink(s, dev, config.timeout_s)
    prev, nxt = layout.peer(s - 1) if s > 0 else -1, layout.peer(s + 1) if s < p - 1 else -1
    peak, stopped = 0, False
    for step in range(config.steps):
        batch = batch_indices(len(y_all), config.batch_size, step, config.seed)
        idx = layout.replica_rows(batch)
        X = torch.as_tensor(X_all[idx], device=dev)
        y = torch.as_tensor(y_all[idx], device=dev)
        slices = microbatch_slices(len(idx), config.microbatches)
        module.zero_grad(set_to_none=True)
        held: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        loss_sum = 0.0
        link.plan(_receives(actions, slices, shapes, s, prev, nxt))
        for kind, k in actions:
            rows = slices[k]
            n = rows.stop - rows.start
            if kind == "F":
                if first:
                    x = X[rows]
                else:
                    x, wait = link.recv((n, *shapes[s]), prev, f"activation of microbatch {k}")
                    ctx.emit(step=step, event="idle", microbatch=k, duration=wait, t_start=ctx_now(ctx) - wait)
                    ctx.emit(step=step, event="recv", microbatch=k, peer=prev, bytes_received=x.numel() * 4)
                    x.requires_grad_(True)
                t = ctx_now(ctx)
                out = module(x)
                if last:  # the loss of the whole batch is the sum of the microbatches' shares
                    out = nn.functional.cross_entropy(out, y[rows], reduction="sum") / len(batch)
                    loss_sum += float(out.item())
                device_sync(dev)
                emulated = emulate_device(t, config.emulated_forward_s, ctx)
                held[k] = (x, out)
                peak = max(peak, len(held))
                ctx.emit(step=step, event="forward", microbatch=k, t_start=t, duration=ctx_now(ctx) - t,
                         held=len(held), **emulated)
                if not last:
                    sent = link.send(out, nxt, f"activation of microbatch {k}")
                    ctx.emit(step=step, event="send", microbatch=k, peer=nxt, bytes_sent=sent)
            else:
                x, out = held.pop(k)
                grad = None
                if not last:
                    grad, wait = link.recv(tuple(out.shape), nxt, f"gradient of microbatch {k}")
                    ctx.emit(step=step, event="idle", microbatch=k, duration=wait, t_start=ctx_now(ctx) - wait)
                    ctx.emit(step=step, event="recv", microbatch=k, peer=nxt, bytes_received=grad.numel() * 4)
                t = ctx_now(ctx)
                if out.requires_grad:
                    out.backward(grad)
                device_sync(dev)
                emulated = emulate_device(t, config.backward_device_s, ctx)
                ctx.emit(step=step, event="backward", microbatch=k, t_start=t, duration=ctx_now(ctx) - t,
                         held=len(held), **emulated)
                if not first:
                    g = x.grad if x.grad is not None else torch.zeros_like(x)
                    sent = link.send(g, prev, f"gradient of microbatch {k}")
                    ctx.emit(step=step, event="send", microbatch=k, peer=prev, bytes_sent=sent)
        link.finish()
        if dp_groups:  # hybrid: the replicas of this stage add up their gradients (and the loss)
            loss_sum, sent = average_replicas(comm, module, dp_groups[s], loss_sum)
            ctx.emit(step=step, event="allreduce", bytes_sent=sent, stage=s)
        applied = _update(module, waiting, staleness, config.lr)
        if last and layout.replica == 0:
            ctx.emit(step=step, event="update", loss=loss_sum, version_read=step - staleness, version_applied=step + 1,
                     staleness=staleness)
        elif applied:
            ctx.emit(step=step, event="stage_update", version_read=step - staleness, staleness=staleness)
        if agree_to_stop(comm, ctx.should_stop()):
            stopped = True
            break
    for group in dp_groups:
        dist.destroy_process_group(group)
    return {"stage": s, "replica": layout.replica, "params": flat_params(module), "grads": flat_grads(module), "peak_held": peak, "stopped": stopped,
            "staleness": staleness}


def _receives(actions: list[tuple[str, int]], slices: list[slice], shapes: list[tuple[int, ...]], s: int,
              prev: int, nxt: int) -> list[tuple[tuple[int, ...], int, str]]:
    """What stage s will receive this step, in the order its schedule asks: activations from prev, gradients from nxt."""
    out = []
    for kind, k in actions:
        n = slices[k].stop - slices[k].start
        if kind == "F" and prev >= 0:
            out.append(((n, *shapes[s]), prev, f"activation of microbatch {k}"))
        elif kind == "B" and nxt >= 0:
            out.append(((n, *shapes[s + 1]), nxt, f"gradient of microbatch {k}"))
    return out


@torch.no_grad()
def _update(module: nn.Module, waiting: deque[list[torch.Tensor]], staleness: int, lr: float) -> bool:
    """SGD with the gradient computed `staleness` steps ago (0: this step's); False while none is old enough."""
    params = list(module.parameters())
    waiting.append([p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in params])
    if len(waiting) <= staleness:
        return False
    for p, g in zip(params, waiting.popleft(), strict=True):
        p -= lr * g
    return True


