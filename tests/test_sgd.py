"""Oracles for chapter 01: parallel gradients equal the full-batch gradient; parallel SGD equals large-batch SGD."""

from __future__ import annotations

import numpy as np
import pytest

from dsgd_teach.data import shard_bounds
from dsgd_teach.models import loss_and_grad
from dsgd_teach.problem import ProblemSpec, get_problem
from dsgd_teach.sgd import (
    DataParallelConfig,
    SGDConfig,
    averaged_gradient,
    batch_indices,
    run_data_parallel,
    run_sgd,
    sgd_steps,
)
from dsgd_teach.sgd.data_parallel import shard_gradient

SPEC = ProblemSpec("digits", "logreg", seed=3)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_shards_cover_every_row_once(world):
    n = 1437
    bounds = [shard_bounds(n, r, world) for r in range(world)]
    rows = np.concatenate([np.arange(a, b) for a, b in bounds])
    assert np.array_equal(rows, np.arange(n))
    sizes = [b - a for a, b in bounds]
    assert max(sizes) - min(sizes) <= 1


def test_sampler_is_deterministic_and_tiles_epochs():
    n, b = 10, 4
    first = [batch_indices(n, b, t, seed=5) for t in range(5)]
    again = [batch_indices(n, b, t, seed=5) for t in range(5)]
    assert all(np.array_equal(x, y) for x, y in zip(first, again, strict=True))
    flat = np.concatenate(first)  # 20 draws = exactly two epochs
    assert sorted(flat[:10]) == list(range(10)) and sorted(flat[10:]) == list(range(10))
    assert not np.array_equal(batch_indices(n, b, 0, seed=6), first[0])
    assert np.array_equal(batch_indices(n, 50, 7, seed=1), np.arange(n))


@pytest.mark.parametrize("model", ["logreg", "mlp", "cnn"])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_averaged_shard_gradients_equal_full_batch_gradient(client, model, world):
    spec = ProblemSpec("digits", model, seed=1)
    problem = get_problem(spec)
    w = problem.init_params + np.float32(0.01)
    big = problem.train.n_samples
    futures = [client.submit(shard_gradient, spec, w, r, world, big, 0, 0, pure=False) for r in range(world)]
    loss, grad = averaged_gradient(client.gather(futures))
    full_loss, full_grad = loss_and_grad(problem.model, w, problem.train.X, problem.train.y)
    np.testing.assert_allclose(grad, full_grad, rtol=1e-4, atol=1e-6)
    assert loss == pytest.approx(full_loss, rel=1e-5)


def test_run_sgd_on_a_worker_equals_the_local_loop(client):
    config = SGDConfig(lr=0.3, batch_size=16, steps=25, seed=3)
    result = run_sgd(config, client)
    expected = sgd_steps(SPEC, 0.3, 16, 25, 3)
    np.testing.assert_allclose(result.params, expected, rtol=1e-6, atol=1e-7)
    updates = result.trace[result.trace.event == "update"]
    assert list(updates.step) == list(range(25))
    assert result.summary["steps"] == 25


def _large_batch_sgd(spec, lr, batch_size, steps, seed, world):
    """Sequential SGD whose batch at step t is the union of every worker's batch at step t."""
    problem = get_problem(spec)
    shards = [problem.train_shard(r, world) for r in range(world)]
    w = problem.init_params.copy()
    for t in range(steps):
        X, y = [], []
        for r, shard in enumerate(shards):
            idx = batch_indices(shard.n_samples, batch_size, t, seed + r)
            X.append(shard.X[idx])
            y.append(shard.y[idx])
        _, g = loss_and_grad(problem.model, w, np.concatenate(X), np.concatenate(y))
        w -= np.float32(lr) * g
    return w


@pytest.mark.parametrize("workers", [1, 2])
def test_data_parallel_equals_large_batch_sgd(client, workers):
    config = DataParallelConfig(lr=0.4, batch_size=20, workers=workers, steps=15, seed=3)
    result = run_data_parallel(config, client)
    expected = _large_batch_sgd(SPEC, 0.4, 20, 15, 3, workers)
    np.testing.assert_allclose(result.params, expected, rtol=1e-5, atol=1e-6)
    grads = result.trace[result.trace.event == "gradient"]
    assert len(grads) == 15 * workers
    assert set(grads.worker) == set(range(workers))
    assert (grads.bytes_sent == 2 * result.params.nbytes).all()


def test_one_worker_data_parallel_equals_sequential_sgd(client):
    dp = run_data_parallel(DataParallelConfig(lr=0.2, batch_size=8, workers=1, steps=10, seed=3), client)
    np.testing.assert_allclose(dp.params, sgd_steps(SPEC, 0.2, 8, 10, 3), rtol=1e-6, atol=1e-7)


def test_sgd_learns(client):
    result = run_sgd(SGDConfig(steps=200, eval_every=50), client)
    evals = result.trace[result.trace.event == "eval"]
    assert evals.loss.iloc[-1] < 0.5 * evals.loss.iloc[0] or evals.loss.iloc[-1] < 0.5
    assert result.summary["final_test_accuracy"] > 0.85
