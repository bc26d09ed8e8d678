"""What every pipeline rank loop shares: its training data, the clock, device time, and the vote on stopping."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ..problem import ProblemSpec, get_problem
from ..runtime.ranks.comm import Comm, wait_for
from ..runtime.ranks.live import WorkerContext

#: About how often the stages vote on stopping, and the most steps between two votes.
VOTE_EVERY_S = 0.05
MAX_STEPS_BETWEEN_VOTES = 32


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
    """Sleep until an action begun at t_start (ctx_now clock) has lasted device_s; its duration, compute_s and
    injected_s, read from one clock so that the two parts add up to the duration exactly.

    device_s = 0 (real compute only) sleeps nothing. The sleep is the *injected* time of an emulated device: the
    stage's own core is free meanwhile, which is why p stages can overlap on fewer than p cores.
    """
    compute = ctx_now(ctx) - t_start
    if device_s <= 0:
        return {"duration": compute, "compute_s": compute, "injected_s": 0.0}
    end = time.perf_counter() + max(0.0, device_s - compute)
    while (left := end - time.perf_counter()) > 0:  # time.sleep may wake early on a signal; finish the wait
        time.sleep(left)
    duration = ctx_now(ctx) - t_start
    return {"duration": duration, "compute_s": compute, "injected_s": duration - compute}


class StopVote:
    """The stages' vote on stopping: a tiny allreduce every few steps that never holds the pipeline up.

    A collective shares its connections with the stages' messages: a vote beside every step made a 2-stage 1F1B
    pipeline with small microbatches about 1.5 times slower on 2 cores (gloo's collective thread competes with the
    link). So the stages vote about every VOTE_EVERY_S seconds. Each vote carries every stage's stop flag and how
    many steps it runs in that time; the maximum of each, the same on every stage, says whether to stop and after how
    many steps the next vote comes. A vote is posted without waiting and read at the next one (long arrived by then),
    so every stage stops after the same step, about VOTE_EVERY_S after any of them was asked to; each wait is
    bounded by timeout_s. The votes go on `group` (None: the default group).
    """

    def __init__(self, comm: Comm, timeout_s: float, group: Any = None) -> None:
        self.comm, self.timeout_s, self.group = comm, timeout_s, group
        self._posted: tuple[torch.Tensor, Any] | None = None
        self._steps, self._next_vote = 0, 1  # steps cast so far; the count at which the next vote comes
        self._last_vote_at, self._last_vote_time = 0, time.perf_counter()

    def cast(self, stop: bool) -> bool:
        """Count this step; at a vote, True on every stage if the previous vote was to stop, else post this one."""
        self._steps += 1
        if self._steps < self._next_vote:
            return False
        previous = self._collect()
        if previous is not None and previous[0]:
            return True
        now = time.perf_counter()
        per_step = (now - self._last_vote_time) / (self._steps - self._last_vote_at)
        steps_per_vote = int(min(MAX_STEPS_BETWEEN_VOTES, max(1.0, VOTE_EVERY_S / max(per_step, 1e-9))))
        self._last_vote_at, self._last_vote_time = self._steps, now
        self._next_vote = self._steps + (previous[1] if previous is not None else 1)
        vote = torch.tensor([1.0 if stop else 0.0, float(steps_per_vote)], device=self.comm.device)
        self._posted = (vote, dist.all_reduce(vote, op=dist.ReduceOp.MAX, group=self.group, async_op=True))
        return False

    def close(self) -> None:
        """Wait for the last vote: no collective may be left in flight when the group is destroyed."""
        self._collect()

    def _collect(self) -> tuple[bool, int] | None:
        """The posted vote's outcome, (any stage asked to stop, steps until the next vote); None if none posted."""
        if self._posted is None:
            return None
        (vote, work), self._posted = self._posted, None
        wait_for(work, self.timeout_s, f"rank {self.comm.rank}: the vote on stopping")
        device_sync(self.comm.device)
        stop, steps = vote.tolist()
        return stop > 0, int(steps)
