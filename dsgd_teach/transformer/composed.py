"""Training one layout of the mesh: data × tensor(+sequence) × pipeline × context or expert parallelism at once.

Each rank joins the world, creates the mesh's groups (mesh.py) and keeps its part of the GPT (mesh_parts.py): the
blocks of its pipeline stage, with each block's heads and MLP columns cut over the tensor axis (Shoeybi et al.
2019), attention by ring over the context axis (Liu et al. 2023), its share of the experts on the expert axis
(Lepikhin et al. 2021). A step is a GPipe step (Huang et al. 2019) on the pipeline axis: every microbatch forward,
activations sent to the next stage, then every microbatch backward, gradients sent back. Then the gradients are
summed over the context axis and over the data axis (the experts' only over the ranks holding the same experts),
each by chapter 05's ring on that axis's group, and every rank takes the same SGD step. A block whose MLP is a
mixture of experts keeps its experts whole on every tensor rank (its attention is split): the tensor axis then
carries attention's two allreduces per layer and direction, and the expert axis the all-to-alls.

The oracle is the single-process GPT on the same global batches (oracle.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from distributed import Client

from ..collectives.algorithms import ring_allreduce
from ..config import Config, check_bool, check_choice, check_float, check_int, check_seed, check_timeout
from ..pipeline.engine import own_group
from ..pipeline.rank_support import StopVote
from ..runtime.ranks.comm import Comm, wait_for
from ..runtime.ranks.group_run import run_group
from ..runtime.ranks.live import WorkerContext
from ..trace import OnUpdate, Result, stat
from .corpus import batch_at, make_corpus
from .experts import aux_loss_of
from .mesh import AXES, Layout, Mesh, join_mesh
from .mesh_parts import (
    SavedBytes,
    StagePart,
    build_part,
    expert_parameters,
    parameter_storages,
    rank_positions,
    rank_rows,
    state_bytes,
)
from .model import GPTShape, build_gpt, lm_loss
from .sequence_parallel import sum_replicated_grads
from .tensor_parallel import replicated_parameters
from .traffic import bytes_per_axis, take_traffic

#: A tiny transformer: eight ranks of it train in seconds on two cores.
TINY_SHAPE = GPTShape(vocab=32, seq_len=16, width=32, heads=4, layers=2, mlp_ratio=2)


@dataclass(frozen=True)
class ComposedConfig(Config):
    """A layout (N_dp, N_tp, p, N_cp, N_ep), a model shape and a few SGD steps of B sequences in m microbatches."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    shape: GPTShape = field(default_factory=lambda: TINY_SHAPE)
    batch: int = 8  # B: sequences per step, all ranks together
    microbatches: int = 2  # m: the pipeline's microbatches per data-parallel rank
    sequence_parallel: bool = False  # Korthikanti et al.'s sequence parallelism on the tensor axis
    balanced: bool = True  # ring attention with two mirrored chunks per context rank
    aux_weight: float = 0.01  # the load-balancing loss's weight (Switch Transformer's alpha) when shape.experts > 0
    steps: int = 3
    lr: float = 0.1
    seed: int = 0
    corpus_tokens: int = 20_000
    threads: int = 1  # torch intra-op threads per rank
    device: str = "cpu"  # the ranks': "cpu" (gloo), "cuda" (NCCL, a GPU per rank) or "auto" (cuda where each has one)
    timeout_s: float = 60.0
    run_timeout_s: float = 600.0

    def validate(self) -> None:
        layout = Layout(self.dp, self.tp, self.pp, self.cp, self.ep)  # ValueError naming the axis
        if not isinstance(self.shape, GPTShape):
            raise ValueError(f"shape must be a GPTShape, got {type(self.shape).__name__}")
        layout.check_fits(self.shape.heads, self.shape.hidden, self.shape.layers, self.shape.seq_len,
                          self.shape.experts)
        check_int("microbatches", self.microbatches, 1, 64)
        check_int("batch", self.batch, 1, 4096)
        if self.batch % (self.dp * self.microbatches):
            raise ValueError(f"batch must be a multiple of dp·microbatches = {self.dp * self.microbatches}, "
                             f"got {self.batch}")
        check_bool("sequence_parallel", self.sequence_parallel)
        if self.sequence_parallel and self.shape.experts:
            raise ValueError("sequence_parallel needs a dense MLP (experts=0): the experts route whole sequences here")
        check_bool("balanced", self.balanced)
        check_float("aux_weight", self.aux_weight, 0.0, 10.0)
        check_int("steps", self.steps, 1, 100_000)
        check_float("lr", self.lr, 0.0, 10.0, lo_open=True)
        check_seed(self.seed)
        check_int("corpus_tokens", self.corpus_tokens, self.shape.seq_len + 1, 10_000_000)
        check_int("threads", self.threads, 1, 64)
        check_choice("device", self.device, ("auto", "cpu", "cuda"))
        check_timeout("timeout_s", self.timeout_s)
        check_timeout("run_timeout_s", self.run_timeout_s, 86400.0)

    @property
    def layout(self) -> Layout:
        """The mesh's axis sizes."""
        return Layout(self.dp, self.tp, self.pp, self.cp, self.ep)

    @property
    def groups(self) -> int:
        """Routing groups of the global batch (N_dp·m microbatches): the oracle's MoE routes in as many."""
        return self.dp * self.microbatches


def composed_rank(ctx: WorkerContext, comm: Comm, config: ComposedConfig) -> dict[str, object]:
    """One rank: join the mesh, keep its part of the GPT, train `steps` GPipe steps; returns its parameters."""
    torch.set_num_threads(config.threads)
    mesh = join_mesh(config.layout, comm)
    device = comm.device  # the CPU (gloo) or this rank's GPU (NCCL): the same code on either
    part = build_part(build_gpt(config.shape, config.seed), config, mesh).to(device)
    corpus = make_corpus(config.seed, config.corpus_tokens, config.shape.vocab)
    positions = rank_positions(config, mesh.coords)  # this rank's sequence positions (all of them unless cp > 1)
    vote = StopVote(comm, config.timeout_s, own_group(config.timeout_s, f"rank {comm.rank}"))
    held = SavedBytes(parameter_storages(part))
    clock = time.time() - time.perf_counter() - ctx.t0
    for step in range(config.steps):
        inputs, targets = batch_at(corpus, step, rank_rows(config.layout, mesh.coords, config.batch), config.batch,
                                   config.shape.seq_len, config.seed)
        inputs, targets = inputs[:, positions].to(device), targets[:, positions].to(device)
        t0 = time.perf_counter()
        held.reset_peak()
        part.zero_grad(set_to_none=False)
        with torch.autograd.graph.saved_tensors_hooks(held.pack, held.unpack):
            loss = gpipe_step(part, mesh, inputs, targets, positions.to(device), config, step, ctx.emit)
        reduce_gradients(part, mesh, config.sequence_parallel)
        with torch.no_grad():
            for p in part.parameters():
                p.add_(p.grad, alpha=-config.lr)
        # the step ends when its loss is known: summed over the ranks holding its shares (predict_step's loss_sum_s)
        loss = total_loss(loss, mesh, part.last, config.sequence_parallel, config.timeout_s, device)
        t1 = time.perf_counter()
        traffic = take_traffic(mesh)  # every message each axis's collectives sent this step
        for row in traffic:
            ctx.emit(step=step, event="traffic", **row)
        sent = {f"bytes_{axis}": n for axis, n in bytes_per_axis(traffic).items()}
        ctx.emit(step=step, event="update", loss=loss,
                 step_s=t1 - t0, start=t0 + clock, end=t1 + clock, bytes_sent=sum(sent.values()), **sent,
                 activation_bytes=held.peak, state_bytes=state_bytes(part), **mesh.coords,
                 version_read=step, version_applied=step + 1)
        if vote.cast(ctx.should_stop()):
            break
    vote.close()
    mesh.close()
    return {"coords": mesh.coords, "params": [p.detach().cpu().numpy().copy() for p in part.parameters()]}


def backward_from(out: torch.Tensor, grad: torch.Tensor | None, aux: torch.Tensor) -> None:
    """Backward from a stage's output: the loss plus the load-balancing loss, or Σ out·grad (whose gradient for out
    is the received grad) plus it. From a scalar because backward given a gradient tensor imports sympy: 34 MiB more
    in each rank. The product's own saved tensors are not the stage's memory: they are kept out of the count."""
    if grad is not None:
        with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
            out = (out * grad).sum()
    (out + aux).backward()


def gpipe_step(part: StagePart, mesh: Mesh, inputs: torch.Tensor, targets: torch.Tensor, positions: torch.Tensor,
               config: ComposedConfig, step: int, emit: Callable[..., None]) -> float:
    """GPipe: all m microbatches forward (activations to the next stage), then all backward; this rank's loss share.

    Each microbatch's loss is its tokens' summed cross-entropy over the global batch's B·s tokens, so the shares of
    all microbatches, data and context ranks add up to the oracle's mean loss (and their gradients to its gradient).
    """
    pp = mesh.comms["pp"]
    tokens = config.batch * config.shape.seq_len
    kept: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []  # (input, output, aux loss) per microbatch
    total = 0.0
    for k, (x, y) in enumerate(zip(inputs.chunk(config.microbatches), targets.chunk(config.microbatches),
                                   strict=True)):
        if not part.first:
            x = torch.empty(part.boundary_shape(len(x)), device=pp.device)
            pp.exchange(recv=x, src=pp.rank - 1, step=k, phase="activation")
            x.requires_grad_(True)
        out = part(x, positions)
        aux = aux_loss_of(part) * (config.aux_weight / config.groups)
        for layer, stats in part.routing_stats():
            emit(step=step, event="routing", microbatch=k, layer=layer, **stats)
        if part.last:
            out = lm_loss(out, y) * (y.numel() / tokens)  # this microbatch's share of the global mean
            total += float(out.detach())
        else:
            pp.exchange(send=out.detach(), dst=pp.rank + 1, step=k, phase="activation")
        kept.append((x, out, aux))
    for k in reversed(range(config.microbatches)):
        x, out, aux = kept.pop()
        grad = None
        if not part.last:
            grad = torch.empty_like(out)
            pp.exchange(recv=grad, src=pp.rank + 1, step=k, phase="gradient")
        backward_from(out, grad, aux)
        if not part.first:
            pp.exchange(send=x.grad, dst=pp.rank - 1, step=k, phase="gradient")
    return total


def reduce_gradients(part: StagePart, mesh: Mesh, sequence_parallel: bool) -> None:
    """Sum the gradients: with sequence parallelism, those of the weights every tensor rank holds whole (each saw its
    1/N_tp of the tokens) over the tensor axis; then all over the context axis; then over the data axis (the
    experts' over the ranks holding the same experts). Each sum is chapter 05's ring on that axis."""
    if part.tensor_group is not None:
        if sequence_parallel:
            sum_replicated_grads(replicated_parameters(part), part.tensor_group)
        part.tensor_group.take_records()  # the axis's Comm log counts its bytes; the records are not kept
    experts = {id(p) for p in expert_parameters(part)}
    everything = list(part.parameters())
    for axis, params in (("cp", everything), ("dp", [p for p in everything if id(p) not in experts]),
                         ("edp", [p for p in everything if id(p) in experts])):
        comm = mesh.comms.get(axis)
        if comm is None or comm.world == 1 or not params:
            continue
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        summed = ring_allreduce(comm, flat)
        offset = 0
        for p in params:
            p.grad.copy_(summed[offset:offset + p.numel()].view_as(p))
            offset += p.numel()


def total_loss(share: float, mesh: Mesh, last: bool, sequence_parallel: bool, timeout_s: float,
               device: torch.device) -> float:
    """The step's loss: the last stage's shares summed over context, data (and with sequence parallelism, tensor)
    ranks, by a library allreduce of one number outside the traced bytes; NaN on the other stages."""
    if not last:
        return float("nan")
    value = torch.tensor([share], dtype=torch.float64, device=device)  # NCCL sums GPU tensors only
    for axis in ("cp", "dp") + (("tp",) if sequence_parallel else ()):
        if axis in mesh.groups:
            wait_for(dist.all_reduce(value, group=mesh.groups[axis], async_op=True), timeout_s,
                     f"rank {mesh.rank}: the loss's sum over {axis}")
    return float(value.item())


def run_composed(config: ComposedConfig, client: Client, on_update: OnUpdate | None = None) -> Result:
    """Train config's layout on the cluster; the trace has one "update" event per rank and step (loss on the last
    stage's ranks, step_s, bytes_dp ... bytes_ep sent on each axis, activation_bytes and state_bytes held)."""
    world = config.layout.world
    run = run_group(client, world, composed_rank, (config,), on_update, device=config.device,
                    timeout_s=config.timeout_s, run_timeout_s=config.run_timeout_s)
    trace = run.trace
    ups = trace[trace.event == "update"]
    losses = ups.dropna(subset=["loss"]).groupby("step").loss.first()
    summary = {
        "wall_s": run.wall_s, "ranks": world, "backend": run.spec.backend,
        "steps": int(ups.step.nunique()) if len(ups) else 0,
        "final_loss": stat(losses, how="last"),
        "median_step_ms": stat(ups, "step_s") * 1e3,
    }
    per_step = ups.groupby("step").max(numeric_only=True) if len(ups) else ups  # the busiest rank of each step
    for axis in AXES:
        summary[f"bytes_{axis}_per_step"] = stat(per_step, f"bytes_{axis}")
    return Result(config, trace, summary, None, run.stopped, extras=run.done)
