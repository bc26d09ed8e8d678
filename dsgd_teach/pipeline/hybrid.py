"""Hybrid parallelism: `replicas` copies of a `stages`-stage pipeline, each on its share of every batch.

Rank = replica * stages + stage. Within a replica the stages pass activations and gradients as usual; the
ranks holding the same stage in different replicas form a data-parallel group and allreduce their gradients
(the library's allreduce over a sub-group) before the update, so all replicas stay identical and together
compute exactly the gradient of the whole batch.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from ..runtime.ranks.comm import Comm, wait_for


@dataclass(frozen=True)
class Layout:
    """Where a rank sits in the stages x replicas grid."""

    stages: int
    replicas: int
    rank: int

    @property
    def stage(self) -> int:
        return self.rank % self.stages

    @property
    def replica(self) -> int:
        return self.rank // self.stages

    def peer(self, stage: int) -> int:
        """Global rank of `stage` in this rank's own replica."""
        return self.replica * self.stages + stage

    def replica_rows(self, idx: np.ndarray) -> np.ndarray:
        """This replica's contiguous share of a batch's row indices."""
        return np.array_split(idx, self.replicas)[self.replica]


def data_parallel_groups(layout: Layout, timeout_s: float) -> list[Any]:
    """One sub-group per stage holding that stage's ranks of every replica (every rank must call this).

    Each gets the run's timeout: a sub-group left with a wait posted to a stalled peer is then torn down within it.
    """
    if layout.replicas == 1:
        return []
    timeout = datetime.timedelta(seconds=timeout_s)
    return [dist.new_group([r * layout.stages + s for r in range(layout.replicas)], timeout=timeout)
            for s in range(layout.stages)]


def average_replicas(comm: Comm, module: nn.Module, group: Any, extra: float, timeout_s: float) -> tuple[float, int]:
    """Sum this stage's gradients (and `extra`, e.g. the loss) over the replicas in place; (summed extra, bytes)."""
    params = list(module.parameters())
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads] + [torch.tensor([extra], device=comm.device)])
    work = dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group, async_op=True)
    wait_for(work, timeout_s, f"rank {comm.rank}: the replicas' allreduce")
    if flat.device.type == "cuda":
        torch.cuda.synchronize(flat.device)
    offset = 0
    for p, g in zip(params, grads, strict=True):
        p.grad = flat[offset:offset + g.numel()].view_as(g).clone()
        offset += g.numel()
    n = dist.get_world_size(group)
    return float(flat[-1].item()), int(2 * (n - 1) * flat.numel() * 4 // n)  # a ring's bytes per rank
