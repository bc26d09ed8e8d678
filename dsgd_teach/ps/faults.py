"""Fault injection for the chapter and its tests: kill a worker's process once a run has made some progress."""

from __future__ import annotations

import os
import signal
from typing import Any

from distributed import Client


class KillWorkerAfter:
    """An on_update callback that SIGKILLs the process of the worker at `address` after `pushes` events.

    The events counted are `event` ("push" by default; EASGD's exchanges are "elastic"), only those from `rank`
    when rank is given. The worker's nanny then starts a fresh worker under a
    new address, as a cluster manager would replace a failed machine. The kill is real: whatever lived in that
    process (a replica, a shard) is gone.
    """

    def __init__(
        self, client: Client, address: str, pushes: int, rank: int | None = None, event: str = "push"
    ) -> None:
        self.address, self.pushes, self.rank, self.event = address, pushes, rank, event
        self.pid = int(client.run(os.getpid, workers=[address])[address])
        self.seen, self.killed = 0, False

    def __call__(self, event: dict[str, Any]) -> None:
        if self.killed or event.get("event") != self.event:
            return
        if self.rank is not None and event.get("worker") != self.rank:
            return
        self.seen += 1
        if self.seen >= self.pushes:
            self.killed = True
            os.kill(self.pid, signal.SIGKILL)
