"""Tensor parallelism inside one block (Shoeybi et al., 2019, "Megatron-LM"): Y = relu(X A) B on n ranks.

A is split by columns: rank r computes its own slice of the hidden layer, relu needs nothing from the others.
B is split by rows: rank r turns its hidden slice into a *partial* Y, and one allreduce adds the partials.
Backward mirrors it: the gradients of A's and B's slices are local, and only dX needs one more allreduce.
The allreduce is chapter 05's (ring, tree, naive or the library's), so the bytes it sends are counted.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from distributed import Client

from ..collectives.algorithms import ALGORITHMS, chunk_offsets
from ..config import Config, check_choice, check_int, check_seed, check_timeout
from ..runtime.ranks.comm import Comm
from ..runtime.ranks.group import DEVICES
from ..runtime.ranks.group_run import run_group
from ..runtime.ranks.live import WorkerContext
from ..trace import OnUpdate, Result


@dataclass(frozen=True)
class TensorParallelExtras:
    """A run's extras: what each rank computed (its output, input gradient and weight-slice gradients)."""

    outputs: list[dict[str, Any]]


@dataclass(frozen=True)
class TensorParallelConfig(Config):
    """One Megatron block of sizes d_in -> d_hidden -> d_out on `rows` inputs, split over `workers` ranks."""

    workers: int = 2
    rows: int = 32
    d_in: int = 64
    d_hidden: int = 256
    d_out: int = 64
    allreduce: str = "ring"
    seed: int = 0
    device: str = "auto"
    timeout_s: float = 20.0
    run_timeout_s: float = 120.0

    def validate(self) -> None:
        check_int("workers", self.workers, 1, 16)
        check_int("rows", self.rows, 1, 65_536)
        check_int("d_in", self.d_in, 1, 8192)
        check_int("d_hidden", self.d_hidden, self.workers, 65_536)
        check_int("d_out", self.d_out, 1, 8192)
        check_choice("allreduce", self.allreduce, tuple(ALGORITHMS))
        check_seed(self.seed)
        check_choice("device", self.device, DEVICES)
        check_timeout("timeout_s", self.timeout_s)
        check_timeout("run_timeout_s", self.run_timeout_s, 86400.0)


def block_tensors(config: TensorParallelConfig) -> dict[str, np.ndarray]:
    """The dense block and its data, from the seed: X, A, B, and dY (the gradient arriving from above)."""
    rng = np.random.default_rng(config.seed)
    def draw(rows: int, cols: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * scale).astype(np.float32)

    return {"X": draw(config.rows, config.d_in), "A": draw(config.d_in, config.d_hidden, config.d_in**-0.5),
            "B": draw(config.d_hidden, config.d_out, config.d_hidden**-0.5), "dY": draw(config.rows, config.d_out)}


def dense_block(config: TensorParallelConfig) -> dict[str, np.ndarray]:
    """The oracle: Y, dX, dA, dB of the unsplit block in one process."""
    t = {k: torch.tensor(v, requires_grad=k != "dY") for k, v in block_tensors(config).items()}
    Y = torch.relu(t["X"] @ t["A"]) @ t["B"]
    Y.backward(t["dY"])
    return {"Y": Y.detach().numpy(), "dX": t["X"].grad.numpy(), "dA": t["A"].grad.numpy(), "dB": t["B"].grad.numpy()}


def column_slice(d_hidden: int, world: int, rank: int) -> slice:
    """The hidden units rank owns (sizes differ by at most one)."""
    off = chunk_offsets(d_hidden, world)
    return slice(off[rank], off[rank + 1])


def _allreduce(comm: Comm, name: str, x: torch.Tensor) -> torch.Tensor:
    """Sum x over the ranks with chapter 05's allreduce `name` (which works on flat vectors)."""
    return ALGORITHMS[name](comm, x.reshape(-1).contiguous()).view_as(x)


class _SumOverRanks(torch.autograd.Function):
    """Forward: allreduce the partial results (Megatron's g). Backward: the gradient passes unchanged."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, comm: Comm, name: str) -> torch.Tensor:  # noqa: ANN401
        return _allreduce(comm, name, x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:  # noqa: ANN401
        return grad, None, None


class _CopyToRanks(torch.autograd.Function):
    """Forward: every rank already has X (Megatron's f). Backward: allreduce the partial input gradients."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, comm: Comm, name: str) -> torch.Tensor:  # noqa: ANN401
        ctx.comm, ctx.name = comm, name
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:  # noqa: ANN401
        return _allreduce(ctx.comm, ctx.name, grad), None, None


def _tp_rank(ctx: WorkerContext, comm: Comm, config: TensorParallelConfig) -> dict[str, Any]:
    """Rank's half of the block: forward with one allreduce, backward with one more; bytes of each counted."""
    t = block_tensors(config)
    cols = column_slice(config.d_hidden, comm.world, comm.rank)
    X = torch.tensor(t["X"], device=comm.device, requires_grad=True)
    A = torch.tensor(t["A"][:, cols], device=comm.device, requires_grad=True)  # columns of A
    B = torch.tensor(t["B"][cols, :], device=comm.device, requires_grad=True)  # matching rows of B
    start = time.perf_counter()
    Y = _SumOverRanks.apply(torch.relu(_CopyToRanks.apply(X, comm, config.allreduce) @ A) @ B, comm,
                            config.allreduce)
    fwd_bytes = comm.bytes_sent()
    comm.take_log()
    Y.backward(torch.tensor(t["dY"], device=comm.device))
    bwd_bytes = comm.bytes_sent()
    comm.take_log()
    ctx.emit(step=0, event="forward", bytes_sent=fwd_bytes, elements=Y.numel())
    ctx.emit(step=0, event="backward", bytes_sent=bwd_bytes, elements=X.numel(), seconds=time.perf_counter() - start)
    return {k: v.detach().cpu().numpy() for k, v in {"Y": Y, "dX": X.grad, "dA": A.grad, "dB": B.grad}.items()}


def run_tensor_parallel(config: TensorParallelConfig, client: Client, on_update: OnUpdate | None = None) -> Result:
    """Run the split block on config.workers ranks; summary holds the largest error against the dense block."""
    run = run_group(client, config.workers, _tp_rank, (config,), on_update, device=config.device,
                    timeout_s=config.timeout_s, run_timeout_s=config.run_timeout_s)
    outs = run.outs
    dense = dense_block(config)
    errors = {k: 0.0 for k in dense}
    for r, out in enumerate(outs):
        cols = column_slice(config.d_hidden, config.workers, r)
        want = {"Y": dense["Y"], "dX": dense["dX"], "dA": dense["dA"][:, cols], "dB": dense["dB"][cols, :]}
        for k, v in want.items():
            errors[k] = max(errors[k], float(np.max(np.abs(out[k] - v), initial=0.0)))
    trace = run.trace
    summary: dict[str, Any] = {"wall_s": run.wall_s, "backend": run.spec.backend,
                               **{f"max_error_{k}": v for k, v in errors.items()}}
    for event in ("forward", "backward"):
        rows = trace[trace.event == event]
        summary[f"{event}_bytes_per_rank"] = float(rows.bytes_sent.max()) if len(rows) else 0.0
    return Result(config, trace, summary, None, run.stopped, TensorParallelExtras(outs))
