"""Chapter 08 faults: a worker killed in the middle of a federated round; the round goes on without its clients."""

from __future__ import annotations

import os
import signal
from typing import Any

import numpy as np
import pytest

from dsgd_teach.averaging import FedAvgConfig, run_fedavg
from dsgd_teach.cluster import worker_addresses

pytestmark = pytest.mark.timeout(150)


class KillAtRound:
    """on_update callback: SIGKILL one worker's process when round `round` has sent its clients out."""

    def __init__(self, pid: int, at_round: int) -> None:
        self.pid, self.at_round, self.killed = pid, at_round, False

    def __call__(self, event: dict[str, Any]) -> None:
        if not self.killed and event.get("event") == "round_start" and event.get("round") == self.at_round:
            self.killed = True
            os.kill(self.pid, signal.SIGKILL)


def test_worker_killed_mid_round_the_round_completes_with_the_others(fresh_client):
    victim = worker_addresses(fresh_client)[0]
    pid = int(fresh_client.run(os.getpid, workers=[victim])[victim])
    # every client waits 1 s (an injected, labelled delay), so the kill lands while the round's clients run
    config = FedAvgConfig(clients=6, fraction=1.0, steps=3, local_epochs=1, client_delay_s=1.0, round_timeout_s=30.0)
    killer = KillAtRound(pid, at_round=1)
    result = run_fedavg(config, fresh_client, killer)
    assert killer.killed
    trace = result.trace
    lost = trace[trace.event == "client_lost"]
    assert len(lost) > 0 and set(lost["round"]) == {1}
    assert set(lost.reason) <= {"worker died", "failed: KilledWorker"}
    updates = trace[trace.event == "update"].set_index("round")
    assert list(updates.index) == [0, 1, 2]  # the run went on to the end
    assert updates.clients_kept[0] == 6 and 0 < updates.clients_kept[1] < 6
    assert updates.clients_lost[1] == len(lost)
    assert np.isfinite(result.params).all()
    assert (trace[trace.event == "client_update"].injected_delay == 1.0).all()
