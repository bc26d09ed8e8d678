"""Chapter 04 on a real three-worker cluster: oracles for sync (with backups and 1-bit) and async SGD."""

from __future__ import annotations

import dask
import numpy as np
import pytest

from dsgd_teach.models import loss_and_grad
from dsgd_teach.problem import get_problem
from dsgd_teach.runtime.clusters.cluster import start_client, worker_addresses
from dsgd_teach.runtime.ranks.live import WorkerLost
from dsgd_teach.sgd import batch_indices
from dsgd_teach.syncasync import AsyncConfig, OneBitCompressor, SyncConfig, run_async, run_sync
from dsgd_teach.trace import StopRequested

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def client3():
    """A private three-worker cluster (two workers plus one backup run at once); see bench NO_PAUSE for why."""
    with dask.config.set({"distributed.worker.memory.pause": False}), start_client(3, quiet=True, use_gpu=False) as c:
        yield c


def _grad(config: SyncConfig, w: np.ndarray, rank: int, version: int) -> np.ndarray:
    problem = get_problem(config.problem)
    shard = problem.train_shard(rank, config.world)
    idx = batch_indices(shard.n_samples, config.batch_size, version, config.seed + rank)
    return loss_and_grad(problem.model, w, shard.X[idx], shard.y[idx])[1]


def test_sync_without_backups_equals_large_batch_sequential_sgd(client3) -> None:
    config = SyncConfig(workers=3, steps=12, lr=0.5, batch_size=16, eval_every=4)
    result = run_sync(config, client3)
    problem = get_problem(config.problem)
    w = problem.init_params.copy()
    for t in range(config.steps):  # the oracle: one big batch, the union of the three workers' batches
        xs, ys = [], []
        for rank in range(3):
            shard = problem.train_shard(rank, 3)
            idx = batch_indices(shard.n_samples, config.batch_size, t, config.seed + rank)
            xs.append(shard.X[idx])
            ys.append(shard.y[idx])
        _, g = loss_and_grad(problem.model, w, np.concatenate(xs), np.concatenate(ys))
        w = w - np.float32(config.lr) * g
    np.testing.assert_allclose(result.params, w, rtol=1e-4, atol=1e-5)
    trace = result.trace
    assert (trace.event == "gradient").sum() == 36 and (trace.event == "discarded").sum() == 0
    assert (trace.event == "eval").sum() == 3
    assert not result.stopped and result.summary["steps"] == 12


def test_backup_step_aggregates_exactly_the_first_n_arrivals(client3) -> None:
    # rank 0 is held up 10 s at every step, whichever steps it reads (on a loaded machine a rank can start a
    # second late and find steps already done, seen twice in CI): every step must be made of ranks 1 and 2, and
    # each of rank 0's gradients cancelled -- its hold-up cut short once the other two completed the step, never
    # sent, never mixed into a later step. Nothing here depends on how fast any rank is, only on ranks 1 and 2
    # completing a step within the 10 s.
    script = [[10.0] * 5, [0.0] * 5, [0.0] * 5]
    config = SyncConfig(workers=2, backups=1, steps=5, lr=0.5, batch_size=16, delay_script=script)
    result = run_sync(config, client3)
    trace = result.trace
    logs = trace[trace.event == "step_log"].set_index("step")
    for version, row in logs.iterrows():
        arrivals, aggregated = row.arrivals.split(","), [a for a in row.aggregated.split(",") if a]
        assert aggregated == arrivals[:2], version
        assert [d for d in row.discarded.split(",") if d] == arrivals[2:], version
        assert sorted(aggregated) == ["1", "2"] and "0" not in arrivals, version
    rank0 = trace[(trace.worker == 0) & trace.event.isin(["gradient", "discarded", "cancelled"])]
    shown = rank0[["time", "step", "event", "version_read", "injected_delay"]].to_string()
    assert len(rank0) >= 1 and set(rank0.event) == {"cancelled"}, shown  # it reads w_0 at least, so is held once
    assert (rank0.injected_delay < 10.0).all() and (rank0.uplink_bytes == 0).all(), shown  # cut short, unsent
    # replay: each step is the row-weighted mean of exactly the aggregated gradients
    w = get_problem(config.problem).init_params.copy()
    for version in range(config.steps):
        ranks = [int(r) for r in logs.loc[version].aggregated.split(",")]
        g = np.mean([_grad(config, w, r, version) for r in ranks], axis=0)
        w = w - np.float32(config.lr) * g
    np.testing.assert_allclose(result.params, w, rtol=1e-4, atol=1e-5)


def test_one_bit_sync_matches_its_replay_and_sends_32x_less(client3) -> None:
    config = SyncConfig(workers=2, steps=6, lr=0.5, batch_size=16, compression=True)
    result = run_sync(config, client3)
    n = get_problem(config.problem).init_params.size
    comps = [OneBitCompressor(n, True) for _ in range(2)]
    w = get_problem(config.problem).init_params.copy()
    for version in range(config.steps):
        decoded = [comps[r].encode(_grad(config, w, r, version)).decode() for r in range(2)]
        w = w - np.float32(config.lr) * np.mean(decoded, axis=0)
    np.testing.assert_allclose(result.params, w, rtol=1e-4, atol=1e-5)
    assert result.summary["raw_uplink_bytes"] > 25 * result.summary["uplink_bytes"]


def test_async_staleness_accounting_and_mean_near_n_minus_1(client3) -> None:
    config = AsyncConfig(workers=2, steps=60, straggler="exponential", severity=0.02, eval_every=20)
    result = run_async(config, client3)
    pushes = result.trace[result.trace.event == "push"]
    assert sorted(pushes.version_applied) == list(range(1, 61))
    assert (pushes.staleness == pushes.version_applied - 1 - pushes.version_read).all()
    assert 0.5 <= pushes.staleness.mean() <= 1.5  # N - 1 = 1 for two equal-speed workers
    assert (result.trace.event == "eval").sum() == 3


def test_bounded_staleness_on_the_cluster(client3) -> None:
    config = AsyncConfig(workers=3, steps=30, staleness_bound=1, straggler="slow_worker", severity=0.03)
    pushes = run_async(config, client3).trace.query("event == 'push'")
    assert len(pushes) == 30 and pushes.staleness.max() <= 1
    assert (pushes.staleness == pushes.version_applied - 1 - pushes.version_read).all()


def test_stop_returns_a_partial_result(client3) -> None:
    seen = []

    def on_update(event: dict) -> None:
        seen.append(event)
        if len(seen) >= 6:
            raise StopRequested

    result = run_sync(SyncConfig(workers=2, backups=1, steps=100_000, straggler="exponential", severity=0.01),
                      client3, on_update)
    assert result.stopped and result.summary["steps"] < 100_000
    result = run_async(AsyncConfig(workers=3, steps=100_000, staleness_bound=1), client3, lambda e: seen.append(e)
                       or (_ for _ in ()).throw(StopRequested()))
    assert result.stopped and result.summary["updates"] < 100_000


def test_too_few_workers_is_a_clear_error(client3) -> None:
    with pytest.raises(ValueError, match=r"resize\(4\)"):
        run_sync(SyncConfig(workers=3, backups=1), client3)


@pytest.mark.timeout(280)
def test_async_on_the_chapter_03_server(fresh_client) -> None:
    pytest.importorskip("dsgd_teach.ps")
    config = AsyncConfig(workers=2, steps=30, server="ps")
    result = run_async(config, fresh_client)
    pushes = result.trace[result.trace.event == "push"]
    assert result.summary["updates"] >= 30
    assert sorted(pushes.version_applied) == list(range(1, len(pushes) + 1))
    assert (pushes.staleness == pushes.version_applied - 1 - pushes.version_read).all()


@pytest.mark.timeout(280)
def test_a_dead_worker_is_a_clear_error_not_a_hang(fresh_client) -> None:
    import os
    import signal

    victim = worker_addresses(fresh_client)[1]  # rank 1's worker; the coordinator sits with rank 0
    pid = fresh_client.run(os.getpid, workers=[victim])[victim]
    seen = []

    def on_update(event: dict) -> None:
        seen.append(event)
        if len(seen) == 4:
            os.kill(pid, signal.SIGKILL)

    config = SyncConfig(workers=2, steps=100_000, straggler="slow_worker", severity=0.05, timeout_s=30)
    with pytest.raises(WorkerLost, match="died"):
        run_sync(config, fresh_client, on_update)
