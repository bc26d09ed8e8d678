"""Large batches: Goyal et al. 2017's linear scaling rule with gradual warm-up, and where it stops working.

Data parallelism over N ranks multiplies the batch by N. Goyal et al. (section 2.1) multiply the learning rate
by the same k = B / B0 and (section 2.2) ramp it up linearly from the base rate over the first steps.
run_scaling trains the same MLP for the same number of samples at growing batch sizes, with and without warm-up.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
from distributed import Client

from ..config import Config, check_float, check_int, check_seed
from ..trace import OnUpdate, Result, TraceRecorder
from .toy import batch, make_mlp


def goyal_lr(step: int, base_lr: float, base_batch: int, batch_size: int, warmup_steps: int) -> float:
    """k * base_lr with k = batch_size / base_batch, reached linearly from base_lr over warmup_steps steps."""
    target = base_lr * batch_size / base_batch
    if warmup_steps <= 0 or step >= warmup_steps:
        return target
    return base_lr + (target - base_lr) * step / warmup_steps


@dataclass(frozen=True)
class ScalingConfig(Config):
    """Train for `samples` samples at base_batch * 2^i for i < doublings, lr scaled linearly, with and without warm-up."""

    base_batch: int = 8
    base_lr: float = 0.05
    doublings: int = 6
    samples: int = 8192
    warmup_fraction: float = 0.25  # of each run's steps
    width: int = 64
    depth: int = 4
    seed: int = 0

    def validate(self) -> None:
        check_int("base_batch", self.base_batch, 1, 4096)
        check_float("base_lr", self.base_lr, 0.0, 10.0, lo_open=True)
        check_int("doublings", self.doublings, 1, 12)
        check_int("samples", self.samples, 1, 10_000_000)
        check_float("warmup_fraction", self.warmup_fraction, 0.0, 1.0)
        check_int("width", self.width, 1, 4096)
        check_int("depth", self.depth, 1, 32)
        check_seed(self.seed)


def train(config: ScalingConfig, batch_size: int, warmup: bool) -> list[dict[str, float]]:
    """One run: SGD at batch_size with the scaled rate for config.samples samples; the loss after every step."""
    torch.manual_seed(config.seed)
    model = make_mlp(config.width, config.depth, seed=config.seed)
    steps = max(1, config.samples // batch_size)
    warm = int(round(config.warmup_fraction * steps)) if warmup else 0
    rows = []
    for step in range(steps):
        lr = goyal_lr(step, config.base_lr, config.base_batch, batch_size, warm)
        x, y = batch(config.seed, step, batch_size, batch_size)
        loss = torch.nn.functional.mse_loss(model(x), y)
        model.zero_grad()
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= lr * p.grad
        value = float(loss.detach())
        rows.append({"step": step, "loss": value if np.isfinite(value) else float("inf"), "lr": lr,
                     "batch_size": batch_size, "warmup": warmup, "samples_seen": (step + 1) * batch_size})
    x, y = batch(config.seed, 10**6, 0, 1024)  # held-out rows of the same task
    with torch.no_grad():
        final = float(torch.nn.functional.mse_loss(model(x), y))
    rows.append({"step": steps, "event": "eval", "loss": final if np.isfinite(final) else float("inf"),
                 "batch_size": batch_size, "warmup": warmup, "samples_seen": steps * batch_size})
    return rows


def sweep(config: ScalingConfig) -> list[dict[str, float]]:
    """Every (batch size, warm-up) run of config, one after another (on a worker)."""
    rows = []
    for i in range(config.doublings):
        for warmup in (False, True):
            rows += train(config, config.base_batch * 2**i, warmup)
    return rows


def run_scaling(config: ScalingConfig, client: Client, on_update: OnUpdate | None = None) -> Result:
    """The sweep on one worker; summary holds the held-out loss of each batch size with and without warm-up."""
    t0 = time.perf_counter()
    recorder = TraceRecorder(on_update)
    rows = client.submit(sweep, config, pure=False).result()
    for row in rows:
        recorder.record(event=row.pop("event", "update"), **row)
    trace = recorder.frame()
    evals = trace[trace.event == "eval"]
    summary: dict[str, float] = {"wall_s": time.perf_counter() - t0}
    for row in evals.itertuples():
        summary[f"loss_B{row.batch_size}_{'warm' if row.warmup else 'cold'}"] = float(row.loss)
    return Result(config, trace, summary)
