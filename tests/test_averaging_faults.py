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


def test_easgd_worker_killed_the_other_worker_and_the_center_go_on(fresh_client):
    from dsgd_teach.averaging import EASGDConfig, run_easgd
    from dsgd_teach.ps.faults import KillWorkerAfter

    addresses = worker_addresses(fresh_client)
    # EASGD rank 0 runs on worker 0; the center's shard fills the cluster from the end, so it lives on worker 1
    config = EASGDConfig(workers=2, steps=1500, sync_every=2, alpha=0.2, lr=0.1, timeout_s=5.0)
    killer = KillWorkerAfter(fresh_client, addresses[0], pushes=20, rank=0, event="elastic")
    result = run_easgd(config, fresh_client, killer)
    assert killer.killed
    trace = result.trace
    assert list(trace[trace.event == "worker_lost"].worker) == [0]
    elastic = trace[trace.event == "elastic"]
    assert elastic[elastic.worker == 1].step.max() == config.steps - 1  # the survivor ran to the end
    assert elastic[elastic.worker == 0].step.max() < config.steps - 1
    assert np.isfinite(result.params).all()
    assert result.summary["final_test_accuracy"] > 0.8  # the center kept training on the survivor's pulls


def test_easgd_center_worker_killed_stops_with_an_error_naming_the_center(fresh_client):
    from dsgd_teach.averaging import EASGDConfig, run_easgd
    from dsgd_teach.ps.faults import KillWorkerAfter

    addresses = worker_addresses(fresh_client)
    config = EASGDConfig(workers=2, steps=100_000, sync_every=2, alpha=0.2, lr=0.1, timeout_s=3.0)
    killer = KillWorkerAfter(fresh_client, addresses[1], pushes=20, rank=0, event="elastic")
    with pytest.raises(RuntimeError, match="center variable is gone.*shard 0"):
        run_easgd(config, fresh_client, killer)
    assert killer.killed
