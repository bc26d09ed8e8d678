"""Tensor (and sequence) parallel training of the GPT on the live cluster: N_tp ranks, one process group.

`run_tp(config, client)` runs tensor_parallel.tp_rank on config.tp dask workers (runtime/ranks/group.py's process group,
every wait bounded by config.timeout_s) and compares each step's loss with the single-process oracle's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from distributed import Client

from ..runtime.ranks.comm import Comm
from ..runtime.ranks.group_run import run_group
from ..runtime.ranks.live import WorkerContext
from ..trace import OnUpdate, Result, stat
from .composed import ComposedConfig
from .oracle import oracle_run
from .tensor_group import TensorGroup
from .tensor_parallel import TPConfig, tp_rank


@dataclass(frozen=True)
class TPExtras:
    """A run's losses per step (summed over the ranks' shares under SP) and the oracle's on the same batches."""

    losses: list[float]
    oracle_losses: list[float]


def oracle_losses(config: TPConfig) -> list[float]:
    """The single-process GPT's loss at each of config's SGD steps, on the same global batches (oracle.py)."""
    same = ComposedConfig(shape=config.shape, batch=config.batch, microbatches=1, steps=config.steps, lr=config.lr,
                          seed=config.seed, corpus_tokens=config.corpus_tokens)
    return oracle_run(same)[0]


def _rank(ctx: WorkerContext, comm: Comm, config: TPConfig) -> dict[str, Any]:
    """One rank of the group: tp_rank on the whole group, its events streamed as they happen."""
    out = tp_rank(TensorGroup(comm, config.how), config, keep_grads=False, emit=ctx.emit)
    return {"loss": out["loss"], "step_s": out["step_s"]}


def run_tp(config: TPConfig, client: Client, on_update: OnUpdate | None = None) -> Result:
    """Train config.steps steps on config.tp ranks; summary: final loss, largest difference from the oracle's
    losses, median step time and bytes each rank sent per step."""
    run = run_group(client, config.tp, _rank, (config,), on_update, device=config.device,
                    timeout_s=config.timeout_s, run_timeout_s=config.run_timeout_s)
    shares = [o["loss"] for o in run.done]
    steps = min((len(s) for s in shares), default=0)
    losses = [sum(s[i] for s in shares) if config.sequence_parallel else shares[0][i] for i in range(steps)]
    want = oracle_losses(config)
    trace = run.trace
    ups = trace[trace.event == "update"] if len(trace) else trace
    summary: dict[str, Any] = {
        "wall_s": run.wall_s, "ranks": config.tp, "backend": run.spec.backend,
        "final_loss": stat(losses, how="last"),
        "max_loss_error": max((abs(a - b) for a, b in zip(losses, want, strict=False)), default=float("nan")),
        "median_step_ms": stat(ups, "step_s") * 1e3,
        "bytes_per_rank_per_step": stat(ups, "bytes_sent"),
    }
    return Result(config, trace, summary, None, run.stopped, TPExtras(losses, want))
