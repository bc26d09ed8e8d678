"""Chapter 03 faults on a real cluster: a replica's worker or a shard's worker is killed in the middle of a run."""

from __future__ import annotations

import numpy as np
import pytest

from dsgd_teach.ps import DownpourConfig, ShardUnavailable, SyncPSConfig, run_downpour, run_sync_ps
from dsgd_teach.ps.faults import KillWorkerAfter
from dsgd_teach.runtime.clusters.cluster import start_client, worker_addresses
from dsgd_teach.runtime.ranks.live import WorkerLost

pytestmark = pytest.mark.timeout(150)


def test_replica_worker_killed_the_others_finish():
    with start_client(2, quiet=True, use_gpu=False) as client:
        addresses = worker_addresses(client)
        # replicas on workers 0 and 1, the one shard on worker 1 (shards fill from the end): killing worker 0
        # takes only replica 0. Events reach the driver in batches, so the kill lands some steps after the 10th push
        # (on a loaded machine replica 0 once finished all of 120 steps first): leave room
        config = DownpourConfig(replicas=2, shards=1, steps=1000, n_fetch=2, lr=0.1, timeout_s=5.0)
        killer = KillWorkerAfter(client, addresses[0], pushes=10, rank=0)
        result = run_downpour(config, client, killer)
    assert killer.killed
    trace = result.trace
    lost = trace[trace.event == "worker_lost"]
    assert list(lost.worker) == [0]
    assert result.summary["replicas_lost"] == 1
    pushes = trace[trace.event == "push"]
    assert pushes[pushes.worker == 1].step.max() == config.steps - 1  # the survivor ran to the end
    assert pushes[pushes.worker == 0].step.max() < config.steps - 1
    # every push the driver saw is in the server's count; a push can also land after its event was lost
    assert result.summary["updates"] >= len(pushes)
    assert np.isfinite(result.params).all()


@pytest.mark.parametrize("checkpoint_every", [5, 0])
def test_shard_worker_killed(checkpoint_every):
    """With checkpoints the shard comes back and lost updates are reported; without, a clear error names it."""
    with start_client(2, quiet=True, use_gpu=False) as client:
        addresses = worker_addresses(client)
        # the replica runs on worker 0, shard 0 on worker 1 (shards fill the cluster from the end)
        # events reach the driver in batches, so the kill lands a little after the 13th push: leave room
        config = DownpourConfig(
            replicas=1, shards=1, steps=400 if checkpoint_every else 100_000, lr=0.05, checkpoint_every=checkpoint_every, timeout_s=3.0, eval_every=10
        )
        killer = KillWorkerAfter(client, addresses[1], pushes=13)
        if checkpoint_every == 0:
            with pytest.raises(ShardUnavailable, match="shard 0 .*checkpointing is off"):
                run_downpour(config, client, killer)
            assert killer.killed
            return
        result = run_downpour(config, client, killer)
    assert killer.killed
    trace = result.trace
    restored = trace[trace.event == "shard_restored"]
    assert len(restored) == 1 and result.summary["shards_restored"] == 1
    ckpt_version = int(restored.version_applied.iloc[0])
    assert ckpt_version % checkpoint_every == 0
    lost = result.summary["lost_updates"]
    assert 0 <= lost < checkpoint_every + 1
    assert int(restored.lost_updates.iloc[0]) == lost
    # every step was pushed exactly once or retried after the restore; the lost ones are gone from the count
    assert config.steps - lost - 1 <= result.summary["updates"] <= config.steps - lost
    assert result.summary["replica_steps"] == config.steps
    assert (trace.event == "shard_unavailable").any()


def test_sync_ps_replica_killed_stops_with_a_clear_error():
    with start_client(2, quiet=True, use_gpu=False) as client:
        addresses = worker_addresses(client)
        config = SyncPSConfig(replicas=2, shards=1, steps=100_000, timeout_s=5.0)
        killer = KillWorkerAfter(client, addresses[0], pushes=5, rank=0)
        with pytest.raises(WorkerLost, match="rank 0"):
            run_sync_ps(config, client, killer)
        assert killer.killed
