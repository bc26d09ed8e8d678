"""Chapter 03 oracles: the sharded server's arithmetic, staleness, idempotency, and Downpour vs sequential SGD."""

from __future__ import annotations

import numpy as np
import pytest

from dsgd_teach.models import loss_and_grad
from dsgd_teach.problem import get_problem
from dsgd_teach.ps import (
    BarrierTimeout,
    DownpourConfig,
    ServerAdagrad,
    ServerSGD,
    ShardedServer,
    SyncPSConfig,
    run_downpour,
    run_sync_ps,
    shard_bounds,
)
from dsgd_teach.ps.runner import check_replicas_and_shards
from dsgd_teach.sgd import batch_indices, sgd_steps
from dsgd_teach.trace import StopRequested

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def ps_client(client):
    """The session cluster with exactly two workers."""
    if client.n_workers() != 2:
        client.resize(2)
    return client


def _grad(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


def test_shard_bounds_tile_the_vector():
    for size, n in [(10, 3), (7, 7), (1000, 4)]:
        bounds = shard_bounds(size, n)
        assert bounds[0][0] == 0 and bounds[-1][1] == size
        assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:], strict=False))
        assert all(hi > lo for lo, hi in bounds)


def test_scripted_interleaving_staleness_and_values(ps_client):
    """Three writers interleaved by hand: receipts give the exact versions and staleness, values the exact sum."""
    init = np.linspace(-1, 1, 11, dtype=np.float32)
    lr = 0.5
    g = {name: _grad(i, 11) for i, name in enumerate("ABCD")}
    with ShardedServer.start(ps_client, init, 3, lr=lr) as server:
        w0, v0 = server.pull()
        np.testing.assert_array_equal(w0, init)
        assert v0 == [0, 0, 0]
        ra = server.push((0, 0), g["A"], v0)  # A read v0, applied first: staleness 0
        rb = server.push((1, 0), g["B"], v0)  # B also read v0, lands after A: staleness 1
        _, v2 = server.pull()
        rc = server.push((2, 0), g["C"], v0)  # C read v0, two updates in between: staleness 2
        rd = server.push((0, 1), g["D"], v2)  # D read v2 (after A, B), C in between: staleness 1
        w, v = server.pull()
    assert v2 == [2, 2, 2] and v == [4, 4, 4]
    for receipts, read, applied, stale in [(ra, 0, 1, 0), (rb, 0, 2, 1), (rc, 0, 3, 2), (rd, 2, 4, 1)]:
        assert [r["shard"] for r in receipts] == [0, 1, 2]
        assert all(r["applied"] for r in receipts)
        assert {(r["version_read"], r["version_applied"], r["staleness"]) for r in receipts} == {(read, applied, stale)}
    assert [r["bytes"] for r in ra] == [12, 16, 16]  # slices [0,3), [3,7), [7,11) of float32
    expected = init.copy()
    for name in "ABCD":
        expected = expected - np.float32(lr) * g[name]
    np.testing.assert_allclose(w, expected, rtol=1e-6, atol=1e-7)


def _push_twice(server, key, grad, versions):
    first = server.push(key, grad, versions)
    second = server.push(key, grad, versions)  # a retried task re-sends the same key
    return first, second


def test_duplicated_push_is_applied_once(ps_client):
    init = np.zeros(8, dtype=np.float32)
    grad = _grad(3, 8)
    with ShardedServer.start(ps_client, init, 2, lr=1.0) as server:
        _, versions = server.pull()
        # from a worker task, so the server's pickled handles are exercised too
        first, second = ps_client.submit(_push_twice, server, (5, 7), grad, versions, pure=False).result(timeout=60)
        again = server.push((5, 7), grad, versions)  # and once more from the driver
        w, v = server.pull()
        stats = server.stats()
    assert all(r["applied"] for r in first)
    assert not any(r["applied"] for r in second + again)
    assert v == [1, 1]
    np.testing.assert_array_equal(w, -grad)
    assert [s["duplicates"] for s in stats] == [2, 2] and [s["pushes"] for s in stats] == [1, 1]


def test_server_adagrad_matches_numpy(ps_client):
    init = _grad(10, 9)
    grads = [_grad(20 + i, 9) for i in range(4)]
    accum = np.full(9, 0.1, dtype=np.float32)
    expected = init.copy()
    for g in grads:
        accum += g * g
        expected = expected - np.float32(0.3) * g / (np.sqrt(accum) + np.float32(1e-10))
    with ShardedServer.start(ps_client, init, 3, optimizer="adagrad", lr=0.3) as server:
        for i, g in enumerate(grads):
            server.push((0, i), g, server.pull()[1])
        w, _ = server.pull()
    np.testing.assert_allclose(w, expected, rtol=1e-5, atol=1e-6)
    opt = ServerAdagrad(9)
    assert opt.apply(init, grads[0], 0.3) is not init  # updates never mutate an array a reader may hold


def test_sync_round_applies_the_mean_once(ps_client):
    init = np.ones(6, dtype=np.float32)
    g0, g1 = _grad(1, 6), _grad(2, 6)
    with ShardedServer.start(ps_client, init, 2, lr=0.5) as server:
        r0 = server.push_sync((0, 0), g0, [0, 0], 2)
        assert server.pull()[1] == [0, 0]  # the round is open until both replicas pushed
        with pytest.raises(BarrierTimeout, match="version 0"):
            server.pull([1, 1], wait_s=0.2)
        server.push_sync((1, 0), g1, [0, 0], 2)
        dup = server.push_sync((1, 0), g1, [0, 0], 2)
        w, v = server.pull([1, 1], wait_s=5)
    assert v == [1, 1] and all(r["applied"] for r in r0) and not any(r["applied"] for r in dup)
    np.testing.assert_allclose(w, init - np.float32(0.5) * (g0 + g1) / 2, rtol=1e-6)


def test_bad_server_arguments(ps_client):
    with pytest.raises(ValueError, match="n_shards"):
        ShardedServer.start(ps_client, np.zeros(3, np.float32), 4)
    with pytest.raises(ValueError, match="optimizer"):
        ShardedServer.start(ps_client, np.zeros(3, np.float32), 1, optimizer="adam")
    with pytest.raises(ValueError, match="lr"):
        ShardedServer.start(ps_client, np.zeros(3, np.float32), 1, lr=-1.0)
    with pytest.raises(ValueError, match="init_params"):
        ShardedServer.start(ps_client, np.zeros((2, 2), np.float32), 1)
    with ShardedServer.start(ps_client, np.zeros(4, np.float32), 2) as server:
        with pytest.raises(ValueError, match="shape"):
            server.push((0, 0), np.zeros(5, np.float32), [0, 0])
        with pytest.raises(ValueError, match="versions_read"):
            server.push((0, 0), np.zeros(4, np.float32), [0])


@pytest.mark.parametrize(
    ("field", "value"),
    [("replicas", 0), ("shards", 0), ("n_fetch", 0), ("n_push", 10_000), ("optimizer", "adam"), ("lr", 0.0),
     ("checkpoint_every", -1), ("timeout_s", 0.0), ("dataset", "mnist"), ("steps", 0)],
)
def test_bad_configs_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        DownpourConfig(**{field: value})


def test_configs_the_cluster_cannot_run(ps_client):
    with pytest.raises(ValueError, match="resize"):
        run_downpour(DownpourConfig(replicas=3, steps=5), ps_client)
    with pytest.raises(ValueError, match="shards must be at most"):
        check_replicas_and_shards(DownpourConfig(replicas=1, shards=16), ps_client, n_params=10)
    check_replicas_and_shards(DownpourConfig(replicas=2, shards=10), ps_client, n_params=10)


@pytest.mark.parametrize("shards", [1, 3])
def test_downpour_one_replica_is_sequential_sgd(ps_client, shards):
    """1 replica, n_fetch = n_push = 1, server SGD: exactly the sequential oracle, whatever the sharding."""
    config = DownpourConfig(replicas=1, shards=shards, steps=25, lr=0.3, batch_size=16, seed=3, eval_every=10)
    result = run_downpour(config, ps_client)
    expected = sgd_steps(config.problem, config.lr, config.batch_size, config.steps, config.seed)
    np.testing.assert_allclose(result.params, expected, rtol=1e-5, atol=1e-6)
    pushes = result.trace[result.trace.event == "push"]
    assert len(pushes) == config.steps * shards
    assert (pushes.staleness == 0).all() and result.summary["updates"] == config.steps
    assert sorted(pushes.shard.unique()) == list(range(shards))


def _downpour_reference(config: DownpourConfig) -> np.ndarray:
    """Single-replica Downpour by hand: fetch, k local steps summing gradients, push the sum."""
    problem = get_problem(config.problem)
    data = problem.train_shard(0, 1)
    w_server = problem.init_params.copy()
    lr = np.float32(config.lr)
    w, accum = w_server.copy(), np.zeros_like(w_server)
    for step in range(config.steps):
        if step % config.n_fetch == 0:
            w = w_server.copy()
        idx = batch_indices(data.n_samples, config.batch_size, step, config.seed)
        _, g = loss_and_grad(problem.model, w, data.X[idx], data.y[idx])
        accum += g
        w = w - lr * g
        if (step + 1) % config.n_push == 0 or step + 1 == config.steps:
            w_server = w_server - lr * accum
            accum = np.zeros_like(accum)
    return w_server


def test_downpour_fetch_and_push_intervals(ps_client):
    config = DownpourConfig(replicas=1, shards=2, steps=22, n_fetch=3, n_push=3, lr=0.2, batch_size=16)
    result = run_downpour(config, ps_client)
    np.testing.assert_allclose(result.params, _downpour_reference(config), rtol=1e-5, atol=1e-6)
    pushes = result.trace[(result.trace.event == "push") & (result.trace.shard == 0)]
    assert list(pushes.step) == [2, 5, 8, 11, 14, 17, 20, 21]
    fetches = result.trace[(result.trace.event == "fetch") & (result.trace.shard == 0)]
    assert list(fetches.step) == list(range(0, 22, 3))


def test_downpour_adagrad_one_replica_matches_reference(ps_client):
    config = DownpourConfig(replicas=1, shards=2, steps=15, optimizer="adagrad", lr=0.05, batch_size=16)
    result = run_downpour(config, ps_client)
    problem = get_problem(config.problem)
    data = problem.train_shard(0, 1)
    opt, w = ServerAdagrad(problem.init_params.size), problem.init_params.copy()
    for step in range(config.steps):
        idx = batch_indices(data.n_samples, config.batch_size, step, config.seed)
        _, g = loss_and_grad(problem.model, w, data.X[idx], data.y[idx])
        w = opt.apply(w, g, config.lr)
    np.testing.assert_allclose(result.params, w, rtol=1e-4, atol=1e-5)


def test_sync_ps_is_synchronous_data_parallel_sgd(ps_client):
    config = SyncPSConfig(replicas=2, shards=2, steps=12, lr=0.3, batch_size=16, seed=1)
    result = run_sync_ps(config, ps_client)
    problem = get_problem(config.problem)
    w = problem.init_params.copy()
    for step in range(config.steps):
        grads = []
        for rank in range(2):
            data = problem.train_shard(rank, 2)
            idx = batch_indices(data.n_samples, config.batch_size, step, config.seed + rank)
            grads.append(loss_and_grad(problem.model, w, data.X[idx], data.y[idx])[1])
        w = w - np.float32(config.lr) * (grads[0] + grads[1]) / np.float32(2)
    np.testing.assert_allclose(result.params, w, rtol=1e-5, atol=1e-6)
    pushes = result.trace[result.trace.event == "push"]
    assert (pushes.staleness == 0).all() and result.summary["updates"] == config.steps


def test_downpour_two_replicas_versions_are_consistent(ps_client):
    """Asynchronous run: every applied push got its own version, and staleness obeys its definition."""
    config = DownpourConfig(replicas=2, shards=2, steps=40, n_fetch=2, n_push=1, lr=0.1)
    result = run_downpour(config, ps_client)
    pushes = result.trace[result.trace.event == "push"]
    for shard in (0, 1):
        mine = pushes[pushes.shard == shard]
        assert sorted(mine.version_applied) == list(range(1, 2 * config.steps + 1))
    assert (pushes.staleness == pushes.version_applied - 1 - pushes.version_read).all()
    assert (pushes.staleness >= 0).all()
    evals = result.trace[result.trace.event == "eval"]
    assert evals.loss.iloc[-1] < get_problem(config.problem).evaluate(get_problem(config.problem).init_params)[
        "train_loss"
    ]
    assert result.summary["replica_steps"] == 2 * config.steps


@pytest.mark.parametrize("kind", ["downpour", "sync"])
def test_stop_request_returns_a_partial_result(ps_client, kind):
    seen = []

    def on_update(event):
        seen.append(event)
        if sum(e["event"] == "push" for e in seen) >= 10:
            raise StopRequested

    if kind == "downpour":
        result = run_downpour(DownpourConfig(replicas=2, steps=100_000), ps_client, on_update)
    else:
        result = run_sync_ps(SyncPSConfig(replicas=2, steps=100_000), ps_client, on_update)
    assert result.stopped
    assert 0 < result.summary["replica_steps"] < 200_000
    assert np.isfinite(result.params).all()


def test_server_sgd_is_bitwise_the_sequential_step():
    rng = np.random.default_rng(5)
    values, grad = rng.standard_normal(1000).astype(np.float32), rng.standard_normal(1000).astype(np.float32)
    for lr in (0.1, 0.2, 0.3, 1e-3):
        new = ServerSGD().apply(values, grad, lr)
        np.testing.assert_array_equal(new, values - np.float32(lr) * grad)
        assert new is not values and new.dtype == np.float32
