"""Chapter 08 faults: a worker killed mid-round (FedAvg), mid-run (EASGD) or between averages (local SGD)."""

from __future__ import annotations

import os
import signal
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch.distributed

from dsgd_teach.averaging import (
    EASGDConfig,
    FedAvgConfig,
    LocalSGDConfig,
    run_easgd,
    run_fedavg,
    run_local_sgd,
)
from dsgd_teach.averaging.plots import plot_local_sgd
from dsgd_teach.models import loss_and_grad
from dsgd_teach.problem import get_problem
from dsgd_teach.ps.faults import KillWorkerAfter
from dsgd_teach.runtime.clusters.cluster import start_client, worker_addresses
from dsgd_teach.runtime.clusters.workers import interleave_hosts
from dsgd_teach.runtime.ranks.live import RankInterrupted, WorkerLost, run_live
from dsgd_teach.sgd import batch_indices
from dsgd_teach.trace import TraceRecorder

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
    addresses = worker_addresses(fresh_client)
    config = EASGDConfig(workers=2, steps=100_000, sync_every=2, alpha=0.2, lr=0.1, timeout_s=3.0)
    killer = KillWorkerAfter(fresh_client, addresses[1], pushes=20, rank=0, event="elastic")
    with pytest.raises(RuntimeError, match="center variable is gone.*shard 0"):
        run_easgd(config, fresh_client, killer)
    assert killer.killed


def local_sgd_replay(config, segments: list[tuple[int, int]]) -> np.ndarray:
    """Local SGD in one process: `segments` lists (world, first step); each regroup re-splits the data."""
    problem = get_problem(config.problem)
    w = problem.init_params.astype(np.float32, copy=True)
    ends = [first for _, first in segments[1:]] + [config.steps]
    for (world, first), end in zip(segments, ends, strict=True):
        shards = [problem.train_shard(r, world) for r in range(world)]
        replicas, rows = [w.copy() for _ in range(world)], [0] * world
        for step in range(first, end):
            for r, shard in enumerate(shards):
                idx = batch_indices(shard.n_samples, config.batch_size, step, config.seed + r)
                _, grad = loss_and_grad(problem.model, replicas[r], shard.X[idx], shard.y[idx])
                replicas[r] -= np.float32(config.lr) * grad
                rows[r] += len(idx)
            if (step + 1) % config.sync_every == 0 or step + 1 == config.steps:
                w = sum(n * x for n, x in zip(rows, replicas, strict=True)) / sum(rows)
                replicas, rows = [w.copy() for _ in range(world)], [0] * world
    return w


@pytest.fixture(scope="module")
def three_workers():
    """A private three-worker cluster: killing one still leaves a group of two that talks through the ring."""
    with start_client(3, quiet=True, use_gpu=False) as c:
        yield c


def kill_rank_after_averages(client, rank: int, averages: int = 5) -> KillWorkerAfter:  # noqa: ANN001
    """SIGKILL the worker that plan_group gives `rank` once rank 0 has traced `averages` averages."""
    address = interleave_hosts(worker_addresses(client))[rank]  # the order plan_group gives ranks
    return KillWorkerAfter(client, address, pushes=averages, rank=0, event="average")


def test_local_sgd_worker_killed_the_others_regroup_from_the_last_average(three_workers):
    config = LocalSGDConfig(workers=3, steps=600, sync_every=4, eval_every=40, lr=0.3, timeout_s=20.0)
    killer = kill_rank_after_averages(three_workers, rank=1)
    result = run_local_sgd(config, three_workers, killer)
    assert killer.killed
    trace = result.trace
    assert list(trace[trace.event == "worker_lost"].worker) == [1]
    regroup = trace[trace.event == "regroup"]
    assert len(regroup) == 1 and regroup.world.iloc[0] == 2
    resumed = int(regroup.step.iloc[0])
    assert resumed % config.sync_every == 0 and 0 < resumed < config.steps
    assert result.summary["local_steps"] == config.steps and result.summary["regroups"] == 1
    # the survivors went on from the last average, on the data re-split in two: the same as this replay
    np.testing.assert_allclose(result.params, local_sgd_replay(config, [(3, 0), (2, resumed)]),
                               rtol=1e-4, atol=1e-5)
    assert result.summary["final_test_accuracy"] > 0.9
    assert not any(three_workers.run(torch.distributed.is_initialized).values())
    fig = plot_local_sgd({"killed": result})
    assert [t.get_text() for t in fig.axes[0].texts] == ["worker lost: 2 left"]
    plt.close(fig)


def test_local_sgd_worker_killed_with_raise_stops_naming_the_dead_rank(three_workers):
    config = LocalSGDConfig(workers=3, steps=600, sync_every=4, lr=0.3, timeout_s=20.0, on_worker_lost="raise")
    killer = kill_rank_after_averages(three_workers, rank=2)
    with pytest.raises(WorkerLost, match="running rank 2 died"):
        run_local_sgd(config, three_workers, killer)
    assert killer.killed


def test_local_sgd_whose_only_worker_dies_says_so(three_workers):
    config = LocalSGDConfig(workers=1, steps=20_000, sync_every=4, lr=0.3, timeout_s=20.0)
    killer = kill_rank_after_averages(three_workers, rank=0)
    with pytest.raises(WorkerLost, match="every worker of the local-SGD run died"):
        run_local_sgd(config, three_workers, killer)
    assert killer.killed


def _interrupted_at_once(ctx, *args):  # noqa: ANN001, ANN002
    raise RankInterrupted(f"rank {ctx.rank}: a peer looks gone", "state")


def test_an_interrupted_rank_without_a_dead_worker_is_still_an_error(client):
    """A peer that stalls (alive to the scheduler) is not a loss to recover from: the run fails loudly."""
    with pytest.raises(RuntimeError, match="RankInterrupted: rank 0: a peer looks gone"):
        run_live(client, _interrupted_at_once, [()], TraceRecorder(), on_worker_lost="drop", timeout_s=60)
