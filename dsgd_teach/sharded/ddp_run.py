"""Chapter 09's first experiment: overlapped bucketed DDP on the live cluster, optionally next to torch's DDP.

Every rank trains the same MLP on its own batches with SGD; gradients are averaged by OverlappedDDP (the course's
ring or the library allreduce) after `accumulate` microbatches, of which only the last communicates. With
compare_torch, each step is followed by the same step of torch.nn.parallel.DistributedDataParallel on a copy of
the model, in the same process group, so step times are measured in interleaved rounds and the two models can be
compared parameter for parameter. With compare_back_to_back, a third copy runs our DDP with overlap=False (the
same buckets, every allreduce after backward): the baseline that overlap must beat, timed in the same rotation.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
import torch
from distributed import Client

from ..config import Config, check_bool, check_choice, check_float, check_int, check_seed, check_timeout
from ..runtime.ranks.comm import Comm
from ..runtime.ranks.group import DEVICES
from ..runtime.ranks.group_run import run_group
from ..runtime.ranks.live import WorkerContext
from ..trace import OnUpdate, Result, stat
from .ddp import OverlappedDDP
from .toy import batch, flat_params, make_mlp, n_params


@dataclass(frozen=True)
class DDPConfig(Config):
    """Data-parallel SGD with bucketed allreduces launched from gradient hooks while backward runs."""

    workers: int = 2
    allreduce: str = "library"  # "ring" (chapter 05's, on a communication thread) or "library"
    bucket_mb: float = 1.0
    overlap: bool = True  # False: every bucket after backward, back to back (the baseline)
    accumulate: int = 1  # microbatches per step; only the last one communicates (DDP's no_sync)
    batch_size: int = 16  # rows per microbatch per rank
    width: int = 64
    depth: int = 4
    steps: int = 5
    lr: float = 0.05
    seed: int = 0
    compare_torch: bool = False  # also run torch DDP on the same batches, step by step
    compare_back_to_back: bool = False  # also run our DDP with overlap=False on a copy, step by step (the baseline)
    back_to_back_bucket_mb: float = -1.0  # the baseline's bucket cap; negative: the same as bucket_mb
    threads: int = 1  # torch intra-op threads per rank
    device: str = "auto"
    timeout_s: float = 60.0
    run_timeout_s: float = 600.0

    def validate(self) -> None:
        check_int("workers", self.workers, 1, 16)
        check_choice("allreduce", self.allreduce, ("ring", "library"))
        check_float("bucket_mb", self.bucket_mb, 0.0, 1024.0)
        check_bool("overlap", self.overlap)
        check_int("accumulate", self.accumulate, 1, 64)
        check_int("batch_size", self.batch_size, 1, 4096)
        check_int("width", self.width, 1, 8192)
        check_int("depth", self.depth, 1, 64)
        check_int("steps", self.steps, 1, 100_000)
        check_float("lr", self.lr, 0.0, 10.0, lo_open=True)
        check_seed(self.seed)
        check_bool("compare_torch", self.compare_torch)
        check_bool("compare_back_to_back", self.compare_back_to_back)
        check_float("back_to_back_bucket_mb", self.back_to_back_bucket_mb, -1.0, 1024.0)
        check_int("threads", self.threads, 1, 64)
        check_choice("device", self.device, DEVICES)
        check_timeout("timeout_s", self.timeout_s)
        check_timeout("run_timeout_s", self.run_timeout_s, 86400.0)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def ddp_rank(ctx: WorkerContext, comm: Comm, config: DDPConfig) -> dict[str, np.ndarray]:
    """One rank: `steps` SGD steps of accumulate microbatches each, the gradient averaged by OverlappedDDP."""
    torch.set_num_threads(config.threads)
    dev = comm.device
    clock = time.time() - time.perf_counter() - ctx.t0  # perf_counter -> seconds since the run started
    bucket = int(config.bucket_mb * 2**20)
    model = make_mlp(config.width, config.depth, seed=config.seed).to(dev)
    ddp = OverlappedDDP(model, comm, bucket, config.allreduce, config.overlap)
    opt = torch.optim.SGD(model.parameters(), lr=config.lr)
    ref = ref_opt = None
    if config.compare_torch:
        ref = torch.nn.parallel.DistributedDataParallel(
            make_mlp(config.width, config.depth, seed=config.seed).to(dev), bucket_cap_mb=max(config.bucket_mb, 1e-6))
        ref_opt = torch.optim.SGD(ref.parameters(), lr=config.lr)
    b2b = b2b_opt = None
    if config.compare_back_to_back:  # the same buckets, all launched after backward, on a copy of the model
        b2b_model = make_mlp(config.width, config.depth, seed=config.seed).to(dev)
        b2b_mb = config.bucket_mb if config.back_to_back_bucket_mb < 0 else config.back_to_back_bucket_mb
        b2b = OverlappedDDP(b2b_model, comm, int(b2b_mb * 2**20), config.allreduce, overlap=False)
        b2b_opt = torch.optim.SGD(b2b_model.parameters(), lr=config.lr)
    k, rows = config.accumulate, config.batch_size

    def train(net: OverlappedDDP, optim: torch.optim.Optimizer, x: torch.Tensor,
              y: torch.Tensor) -> tuple[float, float, float, float, float]:
        """One step of ours: (loss, step start, backward start, backward end, step end) on perf_counter's clock."""
        _sync(dev)
        t0 = time.perf_counter()
        optim.zero_grad(set_to_none=False)
        total = t_bwd = t_bwd_end = 0.0
        for j in range(k):
            xs, ys = x[j * rows:(j + 1) * rows], y[j * rows:(j + 1) * rows]
            with net.no_sync() if j < k - 1 else nullcontext():
                loss = torch.nn.functional.mse_loss(net.module(xs), ys) / k
                t_bwd = time.perf_counter()
                loss.backward()
                t_bwd_end = time.perf_counter()
            total += float(loss.detach())
        net.finish()
        optim.step()
        _sync(dev)
        return total, t0, t_bwd, t_bwd_end, time.perf_counter()

    def ours(step: int, x: torch.Tensor, y: torch.Tensor) -> None:
        comm.take_log()
        total, t0, t_bwd, t_bwd_end, t1 = train(ddp, opt, x, y)
        sent = sum(m["bytes"] for m in comm.take_log() if m["direction"] == "send")
        for e in ddp.take_events():
            ctx.emit(step=step, event="bucket", bucket=e["bucket"], start=e["launch_s"] + clock,
                     end=e["done_s"] + clock, bucket_bytes=e["bytes"])
        ctx.emit(step=step, event="backward", start=t_bwd + clock, end=t_bwd_end + clock)
        ctx.emit(step=step, event="update", loss=total, step_s=t1 - t0, bytes_sent=sent,
                 version_read=step, version_applied=step + 1, start=t0 + clock, end=t1 + clock)

    def back_to_back(step: int, x: torch.Tensor, y: torch.Tensor) -> None:
        assert b2b is not None and b2b_opt is not None
        _, t0, t_bwd, t_bwd_end, t1 = train(b2b, b2b_opt, x, y)
        events = b2b.take_events()
        ctx.emit(step=step, event="back_to_back", step_s=t1 - t0, backward_s=t_bwd_end - t_bwd,
                 allreduce_s=sum(e["done_s"] - e["launch_s"] for e in events), buckets=len(events),
                 start=t0 + clock, end=t1 + clock)

    def theirs(step: int, x: torch.Tensor, y: torch.Tensor) -> None:
        assert ref is not None and ref_opt is not None
        _sync(dev)
        t0 = time.perf_counter()
        ref_opt.zero_grad(set_to_none=False)
        for j in range(k):
            xs, ys = x[j * rows:(j + 1) * rows], y[j * rows:(j + 1) * rows]
            with ref.no_sync() if j < k - 1 else nullcontext():
                (torch.nn.functional.mse_loss(ref(xs), ys) / k).backward()
        ref_opt.step()
        _sync(dev)
        ctx.emit(step=step, event="torch_ddp", step_s=time.perf_counter() - t0)

    runs = [ours] + ([theirs] if ref is not None else []) + ([back_to_back] if b2b is not None else [])
    try:
        for step in range(config.steps):
            x, y = batch(config.seed, step, comm.rank, rows * k)
            x, y = x.to(dev), y.to(dev)
            # With references, rotate which goes first, so that none always runs on a warm (or cold) cache.
            for run in runs[step % len(runs):] + runs[:step % len(runs)]:
                run(step, x, y)
            if ctx.should_stop():
                break
    finally:
        ddp.close()
        if b2b is not None:
            b2b.close()
    out = {"params": flat_params(model).cpu().numpy()}
    if ref is not None:
        out["torch_params"] = flat_params(ref.module).cpu().numpy()
    if b2b is not None:
        out["back_to_back_params"] = flat_params(b2b.module).cpu().numpy()
    return out


def run_ddp(config: DDPConfig, client: Client, on_update: OnUpdate | None = None) -> Result:
    """Overlapped bucketed DDP on config.workers ranks; final params are rank 0's."""
    run = run_group(client, config.workers, ddp_rank, (config,), on_update, device=config.device,
                    timeout_s=config.timeout_s, run_timeout_s=config.run_timeout_s)
    trace, done = run.trace, run.done
    ups = trace[trace.event == "update"]
    psi = n_params(make_mlp(config.width, config.depth, seed=config.seed))
    summary = {
        "wall_s": run.wall_s, "backend": run.spec.backend, "params": psi,
        "steps": int(ups.step.nunique()) if len(ups) else 0,
        "median_step_ms": stat(ups, "step_s") * 1e3,
        "bytes_per_step": stat(ups, "bytes_sent"),
        "final_loss": stat(ups[ups.worker == 0], "loss", "last"),
        "max_rank_divergence": float(max(np.abs(o["params"] - done[0]["params"]).max() for o in done)) if done else 0.0,
    }
    if config.compare_torch and done:
        ref = trace[trace.event == "torch_ddp"]
        summary["torch_median_step_ms"] = stat(ref, "step_s") * 1e3
        summary["max_diff_vs_torch_ddp"] = float(max(np.abs(o["params"] - o["torch_params"]).max() for o in done))
    if config.compare_back_to_back:
        b2b = trace[trace.event == "back_to_back"]
        summary["back_to_back_median_step_ms"] = stat(b2b, "step_s") * 1e3
        if done:
            summary["max_diff_vs_back_to_back"] = float(max(
                np.abs(o["params"] - o["back_to_back_params"]).max() for o in done))
    return Result(config, trace, summary, done[0]["params"] if done else None, run.stopped)
