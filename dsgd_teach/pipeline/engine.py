"""What one stage does on its worker, beneath the schedules' loops: messages, autograd, trace events, the update.

A schedule (naive.py, gpipe.py, one_f_one_b.py) is a loop that calls a Stage's six operations; rank_loop.py runs
that loop once per step between taking the step's batch and updating. Every action, wait and message becomes a
trace event with its microbatch id, start and duration, and the number of microbatches whose activations the
stage holds, so the plots come from measurement.

Emulated devices (config.emulated_forward_s > 0): a forward or backward still computes for real (the result is
unchanged), then the stage sleeps until the action has lasted the emulated device's time, as if the stage had an
accelerator of its own that takes that long per microbatch. Messages and the schedule stay real. The sleep is not
work and is never passed off as such: each action's trace event carries `compute_s` (measured computation) and
`injected_s` (the sleep), and the plots draw the injected part hatched.
"""

from __future__ import annotations

import datetime
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..runtime.ranks.comm import Comm
from ..runtime.ranks.live import WorkerContext
from ..sampling import batch_indices
from .actions import Action
from .hybrid import Layout, average_replicas, data_parallel_groups
from .link import StageLink
from .rank_support import StopVote, ctx_now, device_sync, emulate_device, training_data
from .stages import boundary_shapes, build_units, microbatch_slices, stage_module

#: Receives a stage posts before it asks for them (in its schedule's order).
RECEIVES_AHEAD = 4


def own_group(timeout_s: float, who: str = "this rank") -> Any:
    """On gloo, one more group of every rank (its own connections and gloo thread) whose operations fail after
    timeout_s; None on NCCL, where the default group carries everything.

    The default group was joined with a longer timeout (a rank's task may start late on a busy machine), and a
    collective still in flight when a stage fails holds the group's destruction up until that timeout passes.
    Forming the new group waits on every other rank within timeout_s, so the ranks first meet on the default group:
    on a busy machine one rank may reach this line seconds after another (its set-up ran slower), and with a short
    timeout_s that alone failed the run. A neighbour that stalls while the group forms is named.
    """
    if dist.get_backend() != "gloo":
        return None
    dist.barrier()  # bounded by the default group's (longer) timeout
    try:
        return dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))
    except RuntimeError as exc:  # torch's DistStoreError: a rank did not reach the group within timeout_s
        raise TimeoutError(f"{who}: forming a process group with the other stages did not complete within "
                           f"{timeout_s} s (is a neighbouring stage dead or stalled?): {exc}") from exc


class Stage:
    """One stage of one replica on its worker: the operations a schedule's loop calls, and the step around them."""

    def __init__(self, ctx: WorkerContext, comm: Comm, config: Any, gradient_delay: int = 0) -> None:
        self.ctx, self.comm, self.config, self.delay = ctx, comm, config, gradient_delay
        self.layout = Layout(config.stages, config.replicas, comm.rank)
        self.p, self.s, self.dev = config.stages, self.layout.stage, comm.device
        self.first, self.last = self.s == 0, self.s == self.p - 1
        self.dp_groups = data_parallel_groups(self.layout, config.timeout_s)
        self.X_all, self.y_all = training_data(config)
        units = build_units(config.model, self.X_all.shape[1], 10, config.depth, config.hidden, config.seed)
        self.shapes = boundary_shapes(units, self.p, self.X_all.shape[1])  # on the CPU, before units move
        self.module: nn.Module = stage_module(units, self.p, self.s).to(self.dev)
        # gradients do not queue behind activations (link.py)
        self.gradient_group = own_group(config.timeout_s, f"stage {self.s}")
        self.link = StageLink(self.s, self.dev, config.timeout_s, RECEIVES_AHEAD, self.gradient_group)
        # a vote in flight when a stage fails ends with timeout_s
        self.vote_group = own_group(config.timeout_s, f"stage {self.s}")
        self.vote = StopVote(comm, config.timeout_s, self.vote_group)
        self.prev = self.layout.peer(self.s - 1) if not self.first else -1
        self.nxt = self.layout.peer(self.s + 1) if not self.last else -1
        # (step, microbatch) -> (input, output) of its forward, kept until its backward
        self.held: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        self.peak, self.step, self.backward_of, self.loss_sum, self.batch_rows = 0, 0, 0, 0.0, 1
        self.slices: list[slice] = []
        self.X = self.y = torch.empty(0)

    def begin_step(self, step: int, actions: list[Action], backward_of: int | None = None) -> None:
        """Take this step's batch, cut it into microbatches, and post the receives `actions` will ask for.

        Backwards go through the graphs of step `backward_of`'s forwards (default: this step's).
        """
        batch = batch_indices(len(self.y_all), self.config.batch_size, step, self.config.seed)
        idx = self.layout.replica_rows(batch)
        self.step, self.loss_sum, self.batch_rows = step, 0.0, len(batch)
        self.backward_of = step if backward_of is None else backward_of
        self.X = torch.as_tensor(self.X_all[idx], device=self.dev)
        self.y = torch.as_tensor(self.y_all[idx], device=self.dev)
        self.slices = microbatch_slices(len(idx), self.config.microbatches)
        self.link.plan(self._receives(actions))

    def _rows(self, k: int) -> int:
        return self.slices[k].stop - self.slices[k].start

    def _receives(self, actions: list[Action]) -> list[tuple[tuple[int, ...], int, str, bool]]:
        """What this stage will receive, in the order of its actions: activations from prev, gradients from nxt."""
        out = []
        for kind, k in actions:
            if kind == "F" and not self.first:
                out.append(((self._rows(k), *self.shapes[self.s]), self.prev, f"activation of microbatch {k}", False))
            elif kind == "B" and not self.last:
                out.append(((self._rows(k), *self.shapes[self.s + 1]), self.nxt, f"gradient of microbatch {k}", True))
        return out

    def _recv(self, shape: tuple[int, ...], src: int, k: int, what: str) -> torch.Tensor:
        x, wait = self.link.recv(shape, src, f"{what} of microbatch {k}", gradient=what == "gradient")
        self.ctx.emit(step=self.step, event="idle", microbatch=k, duration=wait, t_start=ctx_now(self.ctx) - wait)
        self.ctx.emit(step=self.step, event="recv", microbatch=k, peer=src, bytes_received=x.numel() * 4)
        return x

    def _send(self, tensor: torch.Tensor, dst: int, k: int, what: str, due: int) -> None:
        sent = self.link.send(tensor, dst, f"{what} of microbatch {k}", due=due, gradient=what == "gradient")
        self.ctx.emit(step=self.step, event="send", microbatch=k, peer=dst, bytes_sent=sent)

    def receive_activation(self, k: int) -> torch.Tensor:
        """Microbatch k's input: the batch's rows on the first stage, the previous stage's output elsewhere."""
        if self.first:
            return self.X[self.slices[k]]
        return self._recv((self._rows(k), *self.shapes[self.s]), self.prev, k, "activation").requires_grad_(True)

    def forward(self, k: int, x: torch.Tensor) -> torch.Tensor:
        """This stage's layers on x (the last stage: and its share of the batch's loss); keeps the graph."""
        t = ctx_now(self.ctx)
        out = self.module(x)
        if self.last:  # the loss of the whole batch is the sum of the microbatches' shares
            out = nn.functional.cross_entropy(out, self.y[self.slices[k]], reduction="sum") / self.batch_rows
            self.loss_sum += float(out.item())
        device_sync(self.dev)
        emulated = emulate_device(t, self.config.emulated_forward_s, self.ctx)
        self.held[self.step, k] = (x, out)
        self.peak = max(self.peak, len(self.held))
        self.ctx.emit(step=self.step, event="forward", microbatch=k, t_start=t, held=len(self.held),
                      **emulated)
        return out

    def send_activation(self, k: int, out: torch.Tensor) -> None:
        """Post the output to the next stage (nothing on the last stage)."""
        if not self.last:
            self._send(out, self.nxt, k, "activation", due=self.step)

    def receive_gradient(self, k: int) -> torch.Tensor | None:
        """The gradient of microbatch k's output, from the next stage (None on the last stage: out is the loss)."""
        if self.last:
            return None
        return self._recv((self._rows(k), *self.shapes[self.s + 1]), self.nxt, k, "gradient")

    def backward(self, k: int, grad: torch.Tensor | None) -> torch.Tensor | None:
        """Back-propagate microbatch k (its graph is freed); accumulates .grad, returns the input's gradient."""
        x, out = self.held.pop((self.backward_of, k))
        t = ctx_now(self.ctx)
        if out.requires_grad:
            out.backward(grad)
        device_sync(self.dev)
        emulated = emulate_device(t, self.config.backward_device_s, self.ctx)
        self.ctx.emit(step=self.step, event="backward", microbatch=k, t_start=t, held=len(self.held),
                      batch=self.backward_of, **emulated)
        return x.grad

    def send_gradient(self, k: int, grad_in: torch.Tensor | None) -> None:
        """Post the input's gradient to the previous stage (nothing on the first stage, or after the last step)."""
        if not self.first and self.step + self.delay < self.config.steps:  # used `delay` steps from now
            if grad_in is None:  # the output did not depend on the input
                grad_in = torch.zeros((self._rows(k), *self.shapes[self.s]), device=self.dev)
            self._send(grad_in, self.prev, k, "gradient", due=self.step + self.delay)

    def finish_sends(self) -> None:
        """Wait (bounded) until the sends the neighbours need by now have been delivered."""
        self.link.finish(self.step)

    def sum_over_replicas(self, grads: list[torch.Tensor]) -> list[torch.Tensor]:
        """Hybrid parallelism: add up this stage's gradients (and the loss) over the replicas; one replica: as is."""
        if not self.dp_groups:
            return grads
        for q, g in zip(self.module.parameters(), grads, strict=True):
            q.grad = g
        self.loss_sum, sent = average_replicas(self.comm, self.module, self.dp_groups[self.s], self.loss_sum,
                                               self.config.timeout_s)
        self.ctx.emit(step=self.step, event="allreduce", bytes_sent=sent, stage=self.s)
        return [q.grad for q in self.module.parameters()]

    def report_update(self, version_read: int, staleness: int, applied: bool = True) -> None:
        """Trace the update: the loss on the last stage of the first replica, that the stage updated elsewhere."""
        if self.last and self.layout.replica == 0:
            self.ctx.emit(step=self.step, event="update", loss=self.loss_sum, version_read=version_read,
                          version_applied=self.step + 1, staleness=staleness)
        elif applied:
            self.ctx.emit(step=self.step, event="stage_update", version_read=version_read, staleness=staleness)

    def agree_to_stop(self) -> bool:
        """True on every stage, after the same step, once any stage was asked to stop."""
        return self.vote.cast(self.ctx.should_stop())

    def drain_gradients(self, steps: range, lag: int) -> None:
        """After an early stop, receive the gradients the next stage already sent for these steps' backwards."""
        for step in steps if not self.last else ():
            for batch, k in sorted((key for key in self.held if key[0] == step - lag), reverse=True):
                self.link.recv(tuple(self.held[batch, k][1].shape), self.nxt, f"gradient of microbatch {k}",
                               gradient=True)

    def close(self) -> None:
        """Deliver the sends still in flight, collect the last vote, leave the replicas' sub-groups."""
        self.link.finish()
        self.vote.close()
        for group in [*self.dp_groups, self.gradient_group, self.vote_group]:
            if group is not None:
                dist.destroy_process_group(group)
