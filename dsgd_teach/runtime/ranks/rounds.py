"""Waiting for one round of tasks pinned to workers: what finished, and what was lost and why, never past a deadline.

A client of a federated round (or any task pinned to one worker) is lost when its task fails, when its worker
leaves the cluster, or when the round's deadline passes; the round goes on with the rest.
"""

from __future__ import annotations

import time
from typing import Any

from distributed import Client, Future

from ..clusters.cluster import worker_addresses


def collect(client: Client, futures: dict[int, Future], pinned: dict[int, str], timeout_s: float
            ) -> tuple[dict[int, dict[str, Any]], dict[int, str]]:
    """Wait for the round's clients: (finished results, {client: why it was lost}). Never waits past timeout_s."""
    done: dict[int, dict[str, Any]] = {}
    lost: dict[int, str] = {}
    deadline, last_check = time.monotonic() + timeout_s, 0.0
    while len(done) + len(lost) < len(futures):
        for k, fut in futures.items():
            if k in done or k in lost or not fut.done():
                continue
            if fut.status == "error":
                lost[k] = f"failed: {type(fut.exception()).__name__}"
            else:
                done[k] = fut.result()
        now = time.monotonic()
        if now - last_check > 0.25:
            last_check, alive = now, set(worker_addresses(client))
            for k, address in pinned.items():
                if k not in done and k not in lost and address not in alive:
                    lost[k] = "worker died"
        if now > deadline:
            lost.update({k: "round deadline" for k in futures if k not in done and k not in lost})
        time.sleep(0.002)
    for k in lost:
        futures[k].cancel()
    return done, lost
