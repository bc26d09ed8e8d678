"""What runs inside a dask worker for Hogwild: map the shared block, start the ranks, forward events, stop them.

The processes backend runs one rank per dask worker process (run_live pins them); the threads backend runs every
rank as a thread of a single worker process (the kernels release the GIL). Either way each rank runs
worker.rank_loop in a thread of its own while the task's thread forwards its events and polls the stop flag.
"""

from __future__ import annotations

import queue
import threading
from typing import Any

from ..runtime.ranks.live import WorkerContext
from .config import CountingConfig
from .problem import load_data
from .shm import BlockSpec, attach_block
from .worker import AnyConfig, rank_loop, warm_up


def block_arrays(config: AnyConfig, n_features: int) -> list[tuple[str, str, int]]:
    """Layout of the shared block: the vector being updated, a ready flag and a progress counter per rank, and
    the round-robin baseline's cells (whose turn it is, which ranks are done, and the abort flag that frees them)."""
    target = ("counts", "i8", n_features) if isinstance(config, CountingConfig) else ("w", "f8", n_features)
    return [target, ("ready", "i8", config.workers), ("progress", "i8", config.workers),
            ("turn", "i8", 1), ("done", "i8", config.workers), ("abort", "i8", 1)]


def _run_ranks_in_threads(ctx: WorkerContext, config: AnyConfig, spec: BlockSpec, ranks: list[int], world: int) -> list:
    """Run each rank's loop in its own thread; this task's thread forwards events and polls the stop flag.

    Keeping dask's calls (event sends, the stop flag's round trip to the scheduler) off the updating threads
    means the timed loop measures only the kernels.
    """
    events: queue.Queue[dict[str, Any]] = queue.Queue()
    stop = threading.Event()
    results: dict[int, dict[str, Any]] = {}
    errors: list[BaseException] = []

    def forward() -> None:
        while not events.empty():
            ctx.emit(**events.get_nowait())

    with attach_block(spec) as block:
        warm_up(config, load_data(config.data_spec), block)  # build data and compile once, before the threads

        def body(rank: int) -> None:
            try:
                results[rank] = rank_loop(config, block, rank, world, lambda **e: events.put(e), stop.is_set, ctx.t0)
            except BaseException as exc:  # re-raised in the task below
                errors.append(exc)
                stop.set()

        threads = [threading.Thread(target=body, args=(r,), name=f"hogwild-{r}", daemon=True) for r in ranks]
        for t in threads:
            t.start()
        while alive := [t for t in threads if t.is_alive()]:
            alive[0].join(0.02)
            forward()
            if ctx.should_stop():
                stop.set()
        forward()
    if errors:
        raise errors[0]
    return [results[r] for r in ranks if r in results]


def process_task(ctx: WorkerContext, config: AnyConfig, spec: BlockSpec) -> dict[str, Any] | None:
    """Processes backend: this dask worker process is rank ctx.rank."""
    done = _run_ranks_in_threads(ctx, config, spec, [ctx.rank], ctx.world)
    return done[0] if done else None


def threads_task(ctx: WorkerContext, config: AnyConfig, spec: BlockSpec) -> list[dict[str, Any]]:
    """Threads backend: config.workers ranks as threads of this one process (the kernels release the GIL)."""
    return _run_ranks_in_threads(ctx, config, spec, list(range(config.workers)), config.workers)
