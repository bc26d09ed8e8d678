"""Oracles for the server-side update rules (dsgd_teach/ps/optimizers.py): hand computations, the zero-delay and
lambda = 0 reductions, and one code path for the parameter server, chapter 04's async server and the simulator."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dsgd_teach.ps.optimizers import OPTIMIZERS, ReadLog, make_optimizer
from dsgd_teach.sim import SimConfig, run_simulated
from dsgd_teach.syncasync.replay import replay_async

ZERO_NET = {"alpha_s": 0.0, "bandwidth_Bps": None}


def _w(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32)


def test_adagrad_by_hand() -> None:
    rule = make_optimizer("adagrad", 2)
    w = rule.apply(_w(0.0, 1.0), _w(1.0, 2.0), 0.5)
    np.testing.assert_allclose(w, [-0.5 / math.sqrt(1.1), 1.0 - 0.5 * 2 / math.sqrt(4.1)], rtol=1e-6)
    w = rule.apply(w, _w(-1.0, 0.0), 0.5)
    np.testing.assert_allclose(w[0], -0.5 / math.sqrt(1.1) + 0.5 / math.sqrt(2.1), rtol=1e-6)


def test_adarevision_by_hand_revises_the_rate_given_to_the_gradients_that_landed_during_the_delay() -> None:
    # A and B both read version 0 (z = 0). A's g1 = 1 lands first (no delay): G = 0.1 + 1, w1 = -1/sqrt(1.1).
    # B's g2 lands next, one update stale: g_bck = g1. With g2 = 2 (same sign) G grows by g2^2 + 2 g2 g_bck = 8,
    # the rate drops to 1/sqrt(9.1) and g1's step is revised by (1/sqrt(1.1) - 1/sqrt(9.1)) * g1.
    for g2, G in ((2.0, 9.1), (-2.0, 1.1)):  # opposite signs: G - 4 + ... shrinks, G_max holds, no revision
        rule = make_optimizer("adarevision", 1)
        w0 = _w(0.0)
        rule.read(0, w0)
        rule.read(0, w0)
        w1 = rule.apply(w0, _w(1.0), 1.0, version_read=0, version=0)
        np.testing.assert_allclose(w1, [-1 / math.sqrt(1.1)], rtol=1e-6)
        w2 = rule.apply(w1, _w(g2), 1.0, version_read=0, version=1)
        eta_old, eta = 1 / math.sqrt(1.1), 1 / math.sqrt(max(1.1, 1.1 + g2 * g2 + 2 * g2 * 1.0))
        assert eta == pytest.approx(1 / math.sqrt(G))
        np.testing.assert_allclose(w2, [-eta_old - eta * g2 + (eta_old - eta) * 1.0], rtol=1e-6)


def test_dcasgd_by_hand() -> None:
    # w0 = 1, both read it. g = 0.5 lands with no delay: w1 = 0.95. g = 2 lands one update stale:
    # drift w1 - w0 = -0.05, compensated 2 + 0.5 * 2 * 2 * (-0.05) = 1.9, w2 = 0.95 - 0.1 * 1.9 = 0.76.
    rule = make_optimizer("dcasgd", 1, dc_lambda=0.5)
    w0 = _w(1.0)
    rule.read(0, w0)
    rule.read(0, w0)
    w1 = rule.apply(w0, _w(0.5), 0.1, version_read=0, version=0)
    w2 = rule.apply(w1, _w(2.0), 0.1, version_read=0, version=1)
    np.testing.assert_allclose([w1[0], w2[0]], [0.95, 0.76], rtol=1e-6)


def test_staleness_aware_by_hand() -> None:
    rule = make_optimizer("staleness_aware", 1)
    # lr / (tau + 1): tau = 3 updates missed, divisor 4 (ps.optimizers.staleness_aware_scale)
    assert rule.scale(2, 5) == pytest.approx(1 / 4) and rule.scale(5, 5) == 1.0 and rule.scale(None, 7) == 1.0
    assert rule.scale(4, 5) == pytest.approx(1 / 2)
    np.testing.assert_allclose(rule.apply(_w(1.0), _w(3.0), 0.3, version_read=2, version=5), [0.775], rtol=1e-6)


def test_adarevision_with_zero_delay_is_adagrad_bit_for_bit() -> None:
    rng = np.random.default_rng(0)
    ada, rev = make_optimizer("adagrad", 50), make_optimizer("adarevision", 50)
    wa = wr = rng.standard_normal(50).astype(np.float32)
    for version in range(30):
        g = rng.standard_normal(50).astype(np.float32)
        rev.read(version, wr)  # every gradient read the newest version: no delay
        wa = ada.apply(wa, g, 0.3, version_read=version, version=version)
        wr = rev.apply(wr, g, 0.3, version_read=version, version=version)
        np.testing.assert_array_equal(wa, wr)


def test_read_log_counts_readers_and_forgets_what_nobody_will_push() -> None:
    log = ReadLog(limit=2)
    log.add(0, "a")
    log.add(0, "a")
    assert log.take(0) == "a" and log.take(0) == "a" and log.take(0) is None and log.misses == 1
    for v in range(3):
        log.add(v, v)
    assert list(log.entries) == [1, 2]  # the oldest read fell out


@pytest.mark.parametrize("workers", [1, 6])
def test_simulated_rules_reduce_as_they_must(workers: int) -> None:
    base = SimConfig(algorithm="async", mode="real", workers=workers, steps=60, lr=0.3, compute_cv=0.5, seed=3,
                     eval_every=60, **ZERO_NET)
    plain = run_simulated(base)
    dc0 = run_simulated(base.replace(optimizer="dcasgd", dc_lambda=0.0))
    np.testing.assert_array_equal(dc0.params, plain.params)  # DC-ASGD with lambda = 0 is plain async SGD
    ada = run_simulated(base.replace(optimizer="adagrad"))
    rev = run_simulated(base.replace(optimizer="adarevision"))
    pushes = rev.trace[rev.trace.event == "push"]
    if workers == 1:  # one worker never has a delay: AdaRevision is AdaGrad
        assert (pushes.staleness == 0).all()
        np.testing.assert_array_equal(rev.params, ada.params)
    else:  # with delays the revision must change something, and DC-ASGD with lambda > 0 too
        assert pushes.staleness.mean() > 2
        assert not np.allclose(rev.params, ada.params)
        assert not np.allclose(run_simulated(base.replace(optimizer="dcasgd", dc_lambda=2.0)).params, plain.params)


def test_simulated_rule_replays_from_the_trace() -> None:
    # The server used the delay it observed: replaying the trace's (version_read, version_applied) through the
    # rule, with each gradient taken at the parameters of the version it read, gives the final parameters.
    config = SimConfig(algorithm="async", mode="real", workers=5, steps=40, lr=0.3, compute_cv=0.6, seed=1,
                       optimizer="adarevision", eval_every=40, **ZERO_NET)
    result = run_simulated(config)
    np.testing.assert_allclose(result.params, replay_async(config, result.trace), rtol=1e-5, atol=1e-6)


def test_every_rule_is_selectable_everywhere() -> None:
    from dsgd_teach.ps import DownpourConfig, SyncPSConfig
    from dsgd_teach.syncasync import AsyncConfig

    for name in OPTIMIZERS:
        for cls in (DownpourConfig, SyncPSConfig, AsyncConfig, SimConfig):
            assert cls(optimizer=name).optimizer == name
    with pytest.raises(ValueError, match="optimizer"):
        AsyncConfig(optimizer="adam")
    with pytest.raises(ValueError, match="dc_lambda"):
        SimConfig(dc_lambda=-1.0)
    with pytest.raises(ValueError, match="staleness_aware"):
        AsyncConfig(staleness_aware=True, optimizer="adagrad")


def test_adarevision_beats_adagrad_at_large_delays_and_matches_it_at_small_ones() -> None:
    # McMahan & Streeter's claim, scaled down to stay cheap (the bench runs 1400 workers, 5 seeds): on the sparse
    # logistic regression, with one learning rate, a delay of ~N - 1 = 199 updates leaves AdaGrad behind
    # AdaRevision on every seed, while at ~1 update of delay the two end within a few percent on every seed.
    from dsgd_teach.sim.papers import delay_tolerance

    seeds = (0, 1, 2)
    large = delay_tolerance(workers=(200,), seeds=seeds, steps=400, n_samples=4000)
    assert large.mean_staleness.min() > 100
    loss = large.pivot(index="seed", columns="optimizer", values="final_train_loss")
    assert (loss.adarevision < 0.8 * loss.adagrad).all(), loss
    small = delay_tolerance(workers=(2,), seeds=seeds, steps=200, n_samples=4000)
    loss = small.pivot(index="seed", columns="optimizer", values="final_train_loss")
    np.testing.assert_allclose(loss.adarevision, loss.adagrad, rtol=0.05)
