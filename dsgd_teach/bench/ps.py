"""Chapter 03 benchmark: parameter-server round trips against a bare dask actor call, and Downpour throughput.

All figures come from one run on fresh local clusters; `_ratio` figures compare against the bare actor call
measured in the same run (the machine may be shared and noisy, so absolute times are context only).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from ..ps import DownpourConfig, ShardedServer, run_downpour
from ..runtime.clusters.cluster import worker_addresses
from ..trace import ratio
from .runner import with_client

VECTOR_BYTES = 1 << 20  # 1 MB of float32 parameters


class EchoActor:
    """The reference: a bare dask actor whose methods do nothing with what they receive."""

    def __init__(self, n: int) -> None:
        self.values = np.zeros(n, dtype=np.float32)

    async def nop(self) -> int:
        return 0

    async def swap(self, values: np.ndarray) -> np.ndarray:
        """Receive a vector and send one back (the bytes of a push plus a pull, without any arithmetic)."""
        return self.values


def _interleaved_medians_ms(ops: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median milliseconds of each operation, timed round-robin so load drifts hit all of them alike."""
    for op in ops.values():
        op()  # warm the connections
    times: dict[str, list[float]] = {name: [] for name in ops}
    for _ in range(repeats):
        for name, op in ops.items():
            t = time.perf_counter()
            op()
            times[name].append(time.perf_counter() - t)
    return {name: float(np.median(ts) * 1e3) for name, ts in times.items()}


def round_trips(server: ShardedServer, echo, repeats: int) -> dict[str, float]:
    """Runs on a worker: worker-to-shard timings (the path replicas use), medians in milliseconds."""
    grad = np.full(server.size, 1e-9, dtype=np.float32)
    step = iter(range(10**9))

    def push_then_pull() -> None:
        server.push((0, next(step)), grad, [0] * server.n_shards)
        server.pull()

    def push_pull() -> None:
        server.push_pull((0, next(step)), grad, [0] * server.n_shards)

    ops = {
        "bare_actor_call_ms": lambda: echo.nop().result(timeout=30),
        "bare_actor_1mb_swap_ms": lambda: echo.swap(grad).result(timeout=30),
        "pull_ms": server.pull,
        "push_ms": lambda: server.push((1, next(step)), grad, [0] * server.n_shards),
        "push_pull_ms": push_pull,
        "push_then_pull_ms": push_then_pull,
    }
    return _interleaved_medians_ms(ops, repeats)


def measure(repeats: int = 60, steps: int = 150) -> dict[str, float | str]:
    """Round trips for a 1 MB vector on localhost (1 shard, other worker) and Downpour updates/s, 1 and 2 replicas."""
    figures: dict[str, float | str] = {"vector_bytes": VECTOR_BYTES}
    with with_client(2) as client:
        here, there = worker_addresses(client)
        n = VECTOR_BYTES // 4
        echo = client.submit(EchoActor, n, actor=True, workers=[there], pure=False).result(timeout=60)
        with ShardedServer.start(client, np.zeros(n, np.float32), 1, lr=1e-3, workers=[there]) as server:
            rt = client.submit(round_trips, server, echo, repeats, workers=[here], pure=False).result(timeout=120)
        figures.update({k: round(v, 3) for k, v in rt.items()})
        figures["push_pull_vs_bare_call_ratio"] = round(rt["push_pull_ms"] / rt["bare_actor_call_ms"], 2)
        figures["push_pull_vs_bare_1mb_swap_ratio"] = round(rt["push_pull_ms"] / rt["bare_actor_1mb_swap_ms"], 2)
        figures["push_pull_goal_ms"] = 3.0
        figures["push_pull_vs_goal_ratio"] = round(rt["push_pull_ms"] / 3.0, 3)  # <= 1: the goal is met
        for replicas in (1, 2):
            config = DownpourConfig(replicas=replicas, shards=2, steps=steps, eval_every=10**6)
            result = run_downpour(config, client)
            figures[f"downpour_updates_per_s_{replicas}_replicas"] = round(result.summary["updates_per_s"], 1)
        one, two = figures["downpour_updates_per_s_1_replicas"], figures["downpour_updates_per_s_2_replicas"]
        figures["downpour_2_vs_1_replicas_ratio"] = round(ratio(two, one), 2)
    return figures


if __name__ == "__main__":
    print(measure())
