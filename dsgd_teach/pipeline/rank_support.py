"""What every pipeline rank loop shares: its training data, the clock, device time, and the vote on stopping."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ..problem import ProblemSpec, get_problem
from ..runtime.comm import Comm, wait_for
from ..runtime.live import WorkerContext


def training_data(config: Any) -> tuple[np.ndarray, np.ndarray]:
    """Digits training rows (float32) and labels, rebuilt from the seed in whichever process asks."""
    train = get_problem(ProblemSpec("digits", "logreg", config.seed, config.n_samples)).train
    return np.asarray(train.X, dtype=np.float32), np.asarray(train.y, dtype=np.int64)


def ctx_now(ctx: WorkerContext) -> float:
    """Seconds since the run started, on the same clock as the trace's `time` column."""
    return time.time() - ctx.t0


def device_sync(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA); nothing to wait for on the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def emulate_device(t_start: float, device_s: float, ctx: WorkerContext) -> dict[str, float]:
    """Sleep until an action begun at t_start (ctx_now clock) has lasted device_s; its compute_s and injected_s.

    device_s = 0 (real compute only) sleeps nothing. The sleep is the *injected* time of an emulated device: the
    stage's own core is free meanwhile, which is why p stages can overlap on fewer than p cores.
    """
    compute = ctx_now(ctx) - t_start
    if device_s <= 0:
        return {"compute_s": compute, "injected_s": 0.0}
    end = time.perf_counter() + max(0.0, device_s - compute)
    while (left := end - time.perf_counter()) > 0:  # time.sleep may wake early on a signal; finish the wait
        time.sleep(left)
    return {"compute_s": compute, "injected_s": ctx_now(ctx) - t_start - compute}


class StopVote:
    """The stages' vote on stopping: one tiny allreduce per step that never holds the pipeline up.

    Each step posts its vote without waiting for it and reads the previous step's, which has long arrived (no stage
    finishes a step before its neighbours have finished the one before). Every stage stops after the same step, one
    step after any of them was asked to; each wait is bounded by timeout_s.
    """

    def __init__(self, comm: Comm, timeout_s: float) -> None:
        self.comm, self.timeout_s = comm, timeout_s
        self._posted: tuple[torch.Tensor, Any] | None = None

    def cast(self, stop: bool) -> bool:
        """Post this step's vote; True on every stage when the previous step's vote was to stop."""
        if self._collect():
            return True
        flag = torch.tensor([1.0 if stop else 0.0], device=self.comm.device)
        self._posted = (flag, dist.all_reduce(flag, op=dist.ReduceOp.MAX, async_op=True))
        return False

    def close(self) -> None:
        """Wait for the last vote: no collective may be left in flight when the group is destroyed."""
        self._collect()

    def _collect(self) -> bool:
        if self._posted is None:
            return False
        (flag, work), self._posted = self._posted, None
        wait_for(work, self.timeout_s, f"rank {self.comm.rank}: the vote on stopping")
        device_sync(self.comm.device)
        return bool(flag.item() > 0)
