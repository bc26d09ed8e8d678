"""One driver for an experiment whose ranks form a process group: plan the group, run a rank function on every
rank inside it, and hand back what each rank returned with the trace the ranks streamed."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
from distributed import Client

from ...trace import OnUpdate, TraceRecorder
from .group import GroupSpec, plan_group, run_in_group


@dataclass
class GroupRun:
    """A finished group run: its spec, each rank's return value (None for a rank lost), the trace, whether it was
    stopped, and its wall time."""

    spec: GroupSpec
    outs: list[Any]
    trace: pd.DataFrame
    stopped: bool
    wall_s: float

    @property
    def done(self) -> list[Any]:
        """The return values of the ranks that returned one."""
        return [o for o in self.outs if o is not None]


def run_group(client: Client, world: int, rank_fn: Callable[..., Any], args: tuple[Any, ...],
              on_update: OnUpdate | None = None, *, device: str = "cpu", timeout_s: float, run_timeout_s: float,
              pin_cores: bool = False, args_per_rank: Sequence[tuple[Any, ...]] | None = None) -> GroupRun:
    """Plan a group of `world` ranks and run rank_fn(ctx, comm, *args) on each (args_per_rank[r] where given);
    each wait of the group fails after timeout_s, the whole run after run_timeout_s."""
    t0 = time.perf_counter()
    recorder = TraceRecorder(on_update)
    spec = plan_group(client, world, device, timeout_s, pin_cores=pin_cores)
    per_rank = list(args_per_rank) if args_per_rank is not None else [tuple(args)] * world
    outs, stopped = run_in_group(client, spec, rank_fn, per_rank, recorder, run_timeout_s)
    return GroupRun(spec, outs, recorder.frame(), stopped, time.perf_counter() - t0)
