"""Chapter 09's second experiment: ZeRO-0/1/2/3 Adam on the live cluster, with memory and traffic per rank.

Every step each rank logs the bytes it holds at the optimizer step (parameters, gradients, optimizer state), its
peak, the activations autograd saved, and the elements it sent, next to Rajbhandari et al.'s formulas. With
compare set, each rank also trains an oracle on the same batches in the same process group: single-process Adam
on the global batch ("adam"), or torch's own sharding ("torch": ZeroRedundancyOptimizer for stage 1, fully_shard
for stage 3, DistributedDataParallel for stages 0 and 2).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
from distributed import Client

from ..config import Config, check_choice, check_float, check_int, check_seed, check_timeout
from ..runtime.ranks.comm import Comm
from ..runtime.ranks.group import DEVICES
from ..runtime.ranks.group_run import run_group
from ..runtime.ranks.live import WorkerContext
from ..trace import OnUpdate, Result, stat
from .toy import batch, flat_params, make_mlp
from .zero import DTYPES, LossScaler, ZeroAdam, activation_meter, traffic_formula
from .zero_memory import HeldMemory


@dataclass(frozen=True)
class ZeroConfig(Config):
    """Adam sharded by ZeRO stage 0-3 over `workers` ranks, collectives by hand ("ring") or the library's."""

    workers: int = 2
    stage: int = 1
    collective: str = "ring"
    precision: str = "fp32"
    loss_scale: float = 2.0**16  # fp16's initial dynamic loss scale
    bucket_mb: float = 25.0  # stages 0-2 reduce this many MiB of gradients at a time (0: one layer at a time)
    batch_size: int = 16
    width: int = 64
    depth: int = 4
    steps: int = 5
    lr: float = 1e-3
    seed: int = 0
    compare: str = "none"  # "adam": single-process Adam; "torch": ZeroRedundancyOptimizer / fully_shard / DDP
    threads: int = 1
    device: str = "auto"
    timeout_s: float = 60.0
    run_timeout_s: float = 600.0

    def validate(self) -> None:
        check_int("workers", self.workers, 1, 16)
        check_int("stage", self.stage, 0, 3)
        check_choice("collective", self.collective, ("ring", "library"))
        check_choice("precision", self.precision, tuple(DTYPES))
        check_float("loss_scale", self.loss_scale, 1.0, 2.0**32)
        check_float("bucket_mb", self.bucket_mb, 0.0, 1024.0)
        check_int("batch_size", self.batch_size, 1, 4096)
        check_int("width", self.width, 1, 8192)
        check_int("depth", self.depth, 1, 64)
        check_int("steps", self.steps, 1, 100_000)
        check_float("lr", self.lr, 0.0, 1.0, lo_open=True)
        check_seed(self.seed)
        check_choice("compare", self.compare, ("none", "adam", "torch"))
        check_int("threads", self.threads, 1, 64)
        check_choice("device", self.device, DEVICES)
        check_timeout("timeout_s", self.timeout_s)
        check_timeout("run_timeout_s", self.run_timeout_s, 86400.0)


def _loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.mse_loss(model(x).float(), y)


def oracle_params(config: ZeroConfig, comm: Comm) -> torch.Tensor:
    """The parameters an oracle reaches on the same batches (config.compare says which oracle)."""
    dev, n, rows = comm.device, comm.world, config.batch_size
    model = make_mlp(config.width, config.depth, seed=config.seed).to(dev)
    kw = {"lr": config.lr, "foreach": False}
    if config.compare == "adam":  # one process, the global batch: no communication at all
        opt = torch.optim.Adam(model.parameters(), **kw)
        for step in range(config.steps):
            xy = [batch(config.seed, step, r, rows) for r in range(n)]
            x, y = torch.cat([a for a, _ in xy]).to(dev), torch.cat([b for _, b in xy]).to(dev)
            opt.zero_grad()
            _loss(model, x, y).backward()
            opt.step()
        return flat_params(model)
    if config.stage == 3:
        from torch.distributed.fsdp import fully_shard

        for m in model:
            if isinstance(m, torch.nn.Linear):
                fully_shard(m)
        fully_shard(model)
        opt = torch.optim.Adam(model.parameters(), **kw)
        wrapped: torch.nn.Module = model
    else:
        wrapped = torch.nn.parallel.DistributedDataParallel(model)
        if config.stage == 1:
            from torch.distributed.optim import ZeroRedundancyOptimizer

            opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, **kw)
        else:
            opt = torch.optim.Adam(model.parameters(), **kw)
    for step in range(config.steps):
        x, y = batch(config.seed, step, comm.rank, rows)
        opt.zero_grad()
        _loss(wrapped, x.to(dev), y.to(dev)).backward()
        opt.step()
    if config.stage == 3:
        return torch.cat([p.full_tensor().detach().float().reshape(-1) for p in model.parameters()])
    return flat_params(model)


def zero_rank(ctx: WorkerContext, comm: Comm, config: ZeroConfig) -> dict[str, np.ndarray]:
    """One rank: `steps` Adam steps under ZeRO stage config.stage, logging memory and traffic every step."""
    torch.set_num_threads(config.threads)
    dev = comm.device
    model = make_mlp(config.width, config.depth, seed=config.seed).to(dev)
    scaler = LossScaler(config.loss_scale) if config.precision == "fp16" else None
    zero = ZeroAdam(model, comm, config.stage, config.collective, config.precision, lr=config.lr, scaler=scaler,
                    bucket_bytes=int(config.bucket_mb * 2**20))
    psi = sum(u.padded for u in zero.units)
    expect = zero.formula()
    clock = time.time() - time.perf_counter() - ctx.t0  # perf_counter -> seconds since the run started
    try:
        _train(ctx, comm, config, model, zero, psi, expect, clock)
        out = {"params": zero.full_params().cpu().numpy()}
    finally:
        zero.close()
    comm.take_log()
    if config.compare != "none":
        out["oracle"] = oracle_params(config, comm).cpu().numpy()
    return out


def _train(ctx: WorkerContext, comm: Comm, config: ZeroConfig, model: torch.nn.Module, zero: ZeroAdam, psi: int,
           expect: dict[str, float], clock: float) -> None:
    """config.steps steps, each traced with its memory, traffic and the start and end of every collective."""
    dev, dtype = comm.device, DTYPES[config.precision]
    memory = HeldMemory.watch(zero)
    for step in range(config.steps):
        x, y = batch(config.seed, step, comm.rank, config.batch_size)
        x, y = x.to(dev, dtype), y.to(dev)
        comm.take_log()
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        memory.peak = 0
        t0 = time.perf_counter()
        hooks, saved = activation_meter(model)
        with hooks:
            loss = _loss(model, x, y)
        scale = zero.scaler.scale if zero.scaler is not None else 1.0
        t_bwd = time.perf_counter()
        (loss * scale).backward()
        t_bwd_end = time.perf_counter()
        applied = zero.step()
        step_s = time.perf_counter() - t0
        for e in zero.take_events():
            ctx.emit(step=step, event="collective", unit=e["unit"], what=e["what"], start=e["launch_s"] + clock,
                     end=e["done_s"] + clock)
        ctx.emit(step=step, event="backward", start=t_bwd + clock, end=t_bwd_end + clock)
        log = comm.take_log()
        sent = [m for m in log if m["direction"] == "send"]
        held = memory.at_step
        cuda = torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else 0
        ctx.emit(step=step, event="update", loss=float(loss.detach()), step_s=step_s, applied=applied, stage=config.stage,
                 loss_scale=scale, grad_norm=zero.grad_norm, bytes_sent=sum(m["bytes"] for m in sent),
                 elements_sent=sum(m["elements"] for m in sent), elements_formula=traffic_formula(psi, comm.world, config.stage),
                 held_params=held["params"], held_grads=held["grads"], held_optimizer=held["optimizer"],
                 held_total=held["total"], peak_bytes=memory.peak, activation_bytes=saved[0], cuda_max_bytes=cuda,
                 formula_params=expect["params"], formula_grads=expect["grads"], formula_optimizer=expect["optimizer"],
                 formula_total=expect["total"], psi=psi, version_read=step, version_applied=step + 1,
                 start=t0 + clock, end=t0 + step_s + clock)
        if ctx.should_stop():
            break


def run_zero(config: ZeroConfig, client: Client, on_update: OnUpdate | None = None) -> Result:
    """ZeRO-`stage` Adam on config.workers ranks; final params are rank 0's (all ranks hold the same)."""
    run = run_group(client, config.workers, zero_rank, (config,), on_update, device=config.device,
                    timeout_s=config.timeout_s, run_timeout_s=config.run_timeout_s)
    trace, done = run.trace, run.done
    ups = trace[trace.event == "update"]
    last = ups[ups.step == ups.step.max()] if len(ups) else ups
    summary = {
        "wall_s": run.wall_s, "backend": run.spec.backend,
        "psi": int(last.psi.iloc[0]) if len(last) else 0,
        "final_loss": stat(last[last.worker == 0], "loss", "first"),
        "held_bytes": stat(last, "held_total", "max"),
        "formula_bytes": stat(last, "formula_total", "max"),
        "peak_bytes": stat(last, "peak_bytes", "max"),
        "activation_bytes": stat(last, "activation_bytes", "max"),
        # per-rank memory with the activations: measured states + measured activations against formula + the same
        "held_with_activations_bytes": stat(last.held_total + last.activation_bytes, how="max"),
        "formula_with_activations_bytes": stat(last.formula_total + last.activation_bytes, how="max"),
        "peak_with_activations_bytes": stat(last.peak_bytes + last.activation_bytes, how="max"),
        "elements_sent": stat(last, "elements_sent", "max"),
        "elements_formula": stat(last, "elements_formula", "max"),
        "skipped_steps": int((~ups[ups.worker == 0].applied.astype(bool)).sum()) if len(ups) else 0,
        "median_step_ms": stat(ups, "step_s") * 1e3,
    }
    if config.compare != "none" and done:
        summary["max_diff_vs_oracle"] = float(max(np.abs(o["params"] - o["oracle"]).max() for o in done))
    return Result(config, trace, summary, done[0]["params"] if done else None, run.stopped)
