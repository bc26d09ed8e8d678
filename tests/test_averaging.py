"""Chapter 08 oracles: local SGD with H = 1 is synchronous SGD; FedAvg with one full-batch step and C = 1 is
FedSGD is gradient descent on the union; averages weigh clients by their sample counts."""

from __future__ import annotations

import numpy as np
import pytest

from dsgd_teach.averaging import (
    FedAvgConfig,
    LocalSGDConfig,
    client_rows,
    client_sizes,
    describe,
    run_fedavg,
    run_local_sgd,
    split_rows,
    weighted_average,
)
from dsgd_teach.collectives import elements_sent
from dsgd_teach.problem import get_problem
from dsgd_teach.sgd import DataParallelConfig, run_data_parallel, sgd_steps

pytestmark = pytest.mark.timeout(240)


def test_weighted_average_is_the_mean_over_all_samples():
    rng = np.random.default_rng(0)
    counts = [3, 11, 40]
    per_sample = [rng.standard_normal((n, 5)) for n in counts]
    models = [s.mean(axis=0) for s in per_sample]  # each client's model: the mean of its own samples
    union = np.concatenate(per_sample).mean(axis=0)
    np.testing.assert_allclose(weighted_average(models, counts), union, rtol=1e-5, atol=1e-6)
    assert not np.allclose(np.mean(models, axis=0), union, atol=1e-3)  # an unweighted mean would be wrong
    with pytest.raises(ValueError):
        weighted_average(models, [1, 0, 2])


@pytest.mark.parametrize("partition", ["iid", "non-iid"])
def test_partitions_cover_every_row_once_with_uneven_sizes(partition):
    labels = np.repeat(np.arange(10), 50)
    parts = split_rows(labels, 12, partition, 3.0, seed=1)
    rows = np.concatenate(parts)
    assert sorted(rows.tolist()) == list(range(len(labels)))
    sizes = [len(p) for p in parts]
    assert max(sizes) >= 3 * min(sizes)
    if partition == "non-iid":  # clients smaller than a class hold one or two digits
        assert all(len(np.unique(labels[p])) <= 2 for p in parts)
    else:
        assert np.mean([len(np.unique(labels[p])) for p in parts]) > 5


def test_client_sizes_sum_and_skew():
    for n, k, skew in ((1437, 20, 3.0), (100, 100, 0.0), (50, 7, 10.0)):
        sizes = client_sizes(n, k, skew, seed=0)
        assert sizes.sum() == n and sizes.min() >= 1 and len(sizes) == k
    assert client_sizes(100, 10, 0.0, 0).tolist() == [10] * 10


def test_configs_refuse_bad_values():
    with pytest.raises(ValueError, match="fraction"):
        FedAvgConfig(fraction=0.0)
    with pytest.raises(ValueError, match="partition"):
        FedAvgConfig(partition="sorted")
    with pytest.raises(ValueError, match="sync_every"):
        LocalSGDConfig(sync_every=0)
    assert FedAvgConfig(clients=20, fraction=0.1).clients_per_round == 2


def test_local_sgd_with_h1_equals_synchronous_data_parallel(client):
    common = dict(workers=2, batch_size=16, steps=12, lr=0.3, eval_every=4, seed=3)
    local = run_local_sgd(LocalSGDConfig(sync_every=1, **common), client)
    sync = run_data_parallel(DataParallelConfig(**common), client)
    np.testing.assert_allclose(local.params, sync.params, rtol=1e-4, atol=1e-6)
    assert local.summary["rounds"] == 12


def test_local_sgd_on_one_worker_is_sequential_sgd_and_counts_ring_bytes(client):
    config = LocalSGDConfig(workers=1, batch_size=16, steps=10, sync_every=4, lr=0.3, seed=2)
    result = run_local_sgd(config, client)
    reference = sgd_steps(config.problem, config.lr, config.batch_size, config.steps, config.seed)
    np.testing.assert_allclose(result.params, reference, rtol=1e-5, atol=1e-6)
    two = run_local_sgd(config.replace(workers=2, sync_every=3), client)
    averages = two.trace[two.trace.event == "average"]
    assert sorted(set(averages["round"])) == [0, 1, 2, 3]  # 10 steps, H = 3: averages after 3, 6, 9, 10
    message = get_problem(config.problem).init_params.size + 3
    per_rank = elements_sent("ring", message, 2, 0) * 4
    assert elements_sent("ring", message, 2, 1) * 4 == per_rank
    assert (averages.bytes_sent == per_rank).all()
    assert two.summary["bytes_sent"] == 4 * 2 * per_rank
    assert (averages.spread > 0).all()


def test_fedavg_one_full_batch_step_equals_fedsgd_equals_gradient_descent(client):
    common = dict(clients=6, fraction=1.0, steps=4, lr=0.5, partition="non-iid", size_skew=3.0, seed=1)
    fedavg = run_fedavg(FedAvgConfig(algorithm="fedavg", local_epochs=1, batch_size=10_000, **common), client)
    fedsgd = run_fedavg(FedAvgConfig(algorithm="fedsgd", local_epochs=5, batch_size=10, **common), client)
    config = FedAvgConfig(**common)
    sizes = [len(r) for r in client_rows(config.problem, config.clients, config.partition, config.size_skew)]
    assert max(sizes) >= 2 * min(sizes)  # uneven clients: an unweighted mean would not match
    gd = sgd_steps(config.problem, config.lr, 10**6, config.steps, config.seed)
    np.testing.assert_allclose(fedavg.params, fedsgd.params, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(fedsgd.params, gd, rtol=1e-4, atol=1e-5)
    updates = fedavg.trace[fedavg.trace.event == "update"]
    assert (updates.bytes_sent == 2 * 6 * gd.nbytes).all()


def test_fedavg_samples_a_fraction_and_traces_drift_and_dropouts(client):
    config = FedAvgConfig(clients=20, fraction=0.15, steps=5, local_epochs=2, dropout=0.3, seed=4)
    result = run_fedavg(config, client)
    trace = result.trace
    starts = trace[trace.event == "round_start"]
    assert (starts.clients == 3).all() and len(starts) == 5
    kept, lost = trace[trace.event == "client_update"], trace[trace.event == "client_lost"]
    assert len(kept) + len(lost) == 15 and len(lost) > 0
    assert (lost.reason == "dropped out").all()
    assert (kept.drift >= 0).all() and (kept.classes <= 2).all()
    assert result.summary["clients_lost"] == len(lost)
    rows = describe(config.problem, config.clients, config.partition, config.size_skew)
    assert sum(r["rows"] for r in rows) == get_problem(config.problem).train.n_samples


def test_easgd_one_exchange_moves_worker_and_center_towards_each_other(client):
    from dsgd_teach.averaging import EASGDConfig, run_easgd

    config = EASGDConfig(workers=1, steps=6, sync_every=6, alpha=0.25, batch_size=16, lr=0.3, seed=5)
    result = run_easgd(config, client)
    x_t = sgd_steps(config.problem, config.lr, config.batch_size, config.steps, config.seed)
    c0 = get_problem(config.problem).init_params
    np.testing.assert_allclose(result.params, c0 + config.alpha * (x_t - c0), rtol=1e-5, atol=1e-6)
    elastic = result.trace[result.trace.event == "elastic"]
    assert len(elastic) == 1 and elastic.bytes_sent.iloc[0] == 2 * c0.nbytes
    np.testing.assert_allclose(elastic.spread.iloc[0], np.linalg.norm(x_t - c0), rtol=1e-5)


def test_easgd_two_workers_train_the_center(client):
    from dsgd_teach.averaging import EASGDConfig, run_easgd

    result = run_easgd(EASGDConfig(workers=2, steps=60, sync_every=4, alpha=0.2), client)
    elastic = result.trace[result.trace.event == "elastic"]
    assert len(elastic) == 2 * 15
    assert result.summary["final_test_accuracy"] > 0.8
