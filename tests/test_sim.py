"""The simulator's oracles: determinism, sequential SGD exactly, chapter 04's accounting, the ring's closed form."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dsgd_teach.collectives.cost_model import AlphaBeta, predict_seconds
from dsgd_teach.models import loss_and_grad
from dsgd_teach.problem import get_problem
from dsgd_teach.sgd import batch_indices, sgd_steps
from dsgd_teach.sim import SimConfig, from_config, ring_closed_form, run_simulated
from dsgd_teach.sim.run import one_torch_thread
from dsgd_teach.syncasync import simulate_async
from dsgd_teach.trace import TRACE_COLUMNS, StopRequested

pytestmark = pytest.mark.timeout(120)

ZERO_NET = {"alpha_s": 0.0, "bandwidth_Bps": None, "compute_s": 0.0}


def test_deterministic_for_a_seed_and_different_across_seeds() -> None:
    config = SimConfig(
        workers=40, backups=3, steps=15, straggler="lognormal", severity=0.05, compute_cv=0.3, shards=2, seed=3
    )
    a, b = run_simulated(config), run_simulated(config)
    pd.testing.assert_frame_equal(a.trace, b.trace)
    c = run_simulated(config.replace(seed=4))
    assert not np.allclose(a.trace.time.to_numpy()[:50], c.trace.time.to_numpy()[:50])
    asy = config.replace(algorithm="async", steps=200, backups=0)
    pd.testing.assert_frame_equal(run_simulated(asy).trace, run_simulated(asy).trace)


@pytest.mark.parametrize("algorithm", ["sync", "async"])
def test_one_worker_zero_latency_no_stragglers_is_sequential_sgd_exactly(algorithm: str) -> None:
    config = SimConfig(algorithm=algorithm, mode="real", workers=1, steps=30, lr=0.3, batch_size=16,
                       staleness_aware=True, **ZERO_NET)
    result = run_simulated(config)
    with one_torch_thread(True):  # the simulator's gradients run on one torch thread: same summation order
        expected = sgd_steps(config.problem, config.lr, config.batch_size, config.steps, config.seed)
    assert np.array_equal(result.params, expected)  # bit for bit, not allclose
    assert set(TRACE_COLUMNS) <= set(result.trace.columns)
    assert (result.trace.event == "eval").sum() == 3


def test_sync_without_backups_equals_large_batch_sgd() -> None:
    config = SimConfig(mode="real", workers=3, steps=8, lr=0.5, batch_size=16, compute_cv=0.5, alpha_s=1e-3)
    result = run_simulated(config)
    problem = get_problem(config.problem)
    w = problem.init_params.copy()
    for t in range(config.steps):
        xs, ys = [], []
        for rank in range(3):
            shard = problem.train_shard(rank, 3)
            idx = batch_indices(shard.n_samples, config.batch_size, t, config.seed + rank)
            xs.append(shard.X[idx])
            ys.append(shard.y[idx])
        w = w - np.float32(config.lr) * loss_and_grad(problem.model, w, np.concatenate(xs), np.concatenate(ys))[1]
    np.testing.assert_allclose(result.params, w, rtol=1e-4, atol=1e-5)


def test_backup_accounting_on_a_scripted_scenario() -> None:
    # Derived by hand (zero network, zero compute, only the scripted delays), with the cluster's rule that a
    # worker still in its injected delay when the step completes is cancelled and starts on the next version:
    # t=0.1 r0 and t=0.2 r1 complete step 0; r2 (0.35) is cancelled at 0.2 after 0.2 s of its delay.
    # Step 1 starts at 0.2 for all three: r1 at 0.3 and r2 at 0.2+0.25=0.45 complete it; r0 (due at 0.5) is
    # cancelled at 0.45 after 0.25 s. Nothing is discarded: no gradient arrives late.
    script = [[0.1, 0.3], [0.2, 0.1], [0.35, 0.25]]
    config = SimConfig(workers=2, backups=1, steps=2, delay_script=script, **ZERO_NET)
    result = run_simulated(config)
    trace = result.trace
    logs = trace[trace.event == "step_log"].set_index("step")
    assert logs.loc[0, "arrivals"] == "0,1" and logs.loc[0, "aggregated"] == "0,1"
    assert logs.loc[1, "arrivals"] == "1,2" and logs.loc[1, "aggregated"] == "1,2"
    assert not (trace.event == "discarded").any() and result.summary["discarded"] == 0
    updates = trace[trace.event == "update"].sort_values("step")
    np.testing.assert_allclose(updates.step_s, [0.2, 0.25])
    np.testing.assert_allclose(updates.time, [0.2, 0.45])
    cancelled = trace[trace.event == "cancelled"]
    assert list(cancelled.worker) == [2, 0] and list(cancelled.version_read) == [0, 1]
    assert (cancelled.version_applied == -1).all() and (cancelled.uplink_bytes == 0).all()
    np.testing.assert_allclose(cancelled.time, [0.2, 0.45])
    np.testing.assert_allclose(cancelled.injected_delay, [0.2, 0.25])
    assert result.summary["cancelled"] == 2


def test_every_step_aggregates_exactly_workers_gradients_at_scale() -> None:
    config = SimConfig(workers=96, backups=4, steps=20, straggler="exponential", severity=0.05, seed=1)
    trace = run_simulated(config).trace
    grads = trace[trace.event == "gradient"]
    assert grads.groupby("step").size().eq(96).all() and grads.step.nunique() == 20
    logs = trace[trace.event == "step_log"]
    for _, log in logs.iterrows():
        agg = log.aggregated.split(",")
        assert len(agg) == 96 and len(set(agg)) == 96
        assert set(agg).isdisjoint(log.discarded.split(",") if log.discarded else [])


def _script(rng: np.random.Generator, workers: int, length: int) -> list[list[float]]:
    return [list(rng.uniform(0.05, 1.0, size=length).round(6)) for _ in range(workers)]


@pytest.mark.parametrize("bound", [None, 0, 1, 3])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_async_staleness_accounting_matches_chapter_04_scripted(bound: int | None, seed: int) -> None:
    rng = np.random.default_rng(seed)
    workers, steps = 4, 25
    script = _script(rng, workers, 30)  # longer than any worker reaches within `steps` writes
    reference = simulate_async(script, bound)[:steps]
    config = SimConfig(algorithm="async", workers=workers, steps=steps, delay_script=script,
                       staleness_bound=bound, **ZERO_NET)
    pushes = run_simulated(config).trace
    pushes = pushes[pushes.event == "push"]
    got = list(zip(pushes.worker, pushes.version_read, pushes.version_applied, pushes.staleness, strict=True))
    assert got == [tuple(int(v) for v in row) for row in reference]


def test_bounded_staleness_is_never_exceeded_with_random_delays() -> None:
    for seed in range(3):
        config = SimConfig(algorithm="async", workers=12, steps=150, staleness_bound=2, straggler="lognormal",
                           severity=0.02, compute_cv=0.5, seed=seed)
        pushes = run_simulated(config).trace.query("event == 'push'")
        assert len(pushes) == 150 and pushes.staleness.max() <= 2


def test_equal_speed_async_workers_have_staleness_n_minus_1() -> None:
    for n in (1, 5, 50):
        s = run_simulated(SimConfig(algorithm="async", workers=n, steps=4 * n + 4)).summary
        assert s["steady_mean_staleness"] == n - 1
    jittered = run_simulated(SimConfig(algorithm="async", workers=64, steps=640, compute_cv=0.4, seed=5)).summary
    assert jittered["steady_mean_staleness"] == pytest.approx(63, rel=0.1)


def test_staleness_aware_rule_scales_the_step() -> None:
    config = SimConfig(algorithm="async", mode="real", workers=4, steps=40, staleness_aware=True, compute_cv=0.3)
    pushes = run_simulated(config).trace.query("event == 'push'")
    np.testing.assert_allclose(pushes.lr_scale, 1.0 / (pushes.staleness + 1))
    plain = run_simulated(config.replace(staleness_aware=False)).trace.query("event == 'push'")
    assert (plain.lr_scale == 1.0).all()


@pytest.mark.parametrize("n", [2, 3, 8, 100, 1000])
def test_ring_time_equals_the_closed_form(n: int) -> None:
    alpha, bandwidth, elements = 3e-5, 2e9, 12_288_000  # divisible by every n: K/N is exact
    config = SimConfig(algorithm="allreduce", comm="ring", workers=n, steps=2, elements=elements, alpha_s=alpha,
                       bandwidth_Bps=bandwidth)
    result = run_simulated(config)
    expected = ring_closed_form(alpha, bandwidth, n, elements * 4)
    np.testing.assert_allclose(result.trace.slowest_seconds, [expected, expected], rtol=1e-12)
    assert result.summary["median_ms"] == pytest.approx(expected * 1e3, rel=1e-12)


@pytest.mark.parametrize("comm", ["naive", "doubling", "ring"])
@pytest.mark.parametrize("n", [2, 5, 16])
def test_allreduce_times_match_chapter_05_cost_model(comm: str, n: int) -> None:
    alpha, bandwidth, elements = 1e-4, 1e9, 12_345
    config = SimConfig(algorithm="allreduce", comm=comm, workers=n, steps=1, elements=elements, alpha_s=alpha,
                       bandwidth_Bps=bandwidth)
    expected = predict_seconds(AlphaBeta(alpha, 1 / bandwidth), comm, n, elements)
    assert run_simulated(config).summary["median_ms"] == pytest.approx(expected * 1e3, rel=1e-9)


def test_recursive_doubling_is_called_doubling_and_tree_is_only_its_old_alias() -> None:
    from dsgd_teach.collectives import AllreduceConfig
    from dsgd_teach.sim.config import COMMS
    from dsgd_teach.sim.papers import allreduce_vs_workers

    assert "doubling" in COMMS and "tree" not in COMMS  # a butterfly, not a tree
    old = SimConfig(algorithm="allreduce", comm="tree", workers=4, steps=1, elements=1000)
    new = SimConfig(algorithm="allreduce", comm="doubling", workers=4, steps=1, elements=1000)
    assert old == new and old.comm == "doubling"  # chapter 05's alias, as the collectives package resolves it
    assert from_config(AllreduceConfig(workers=4, algorithm="tree", elements=100, repeats=1)).comm == "doubling"
    assert set(allreduce_vs_workers(ns=(2, 4), elements=1000).algorithm) == {"naive", "doubling", "ring"}
    with pytest.raises(ValueError, match="comm must be one of 'naive', 'doubling', 'ring'"):
        SimConfig(comm="butterfly")


def test_central_server_grows_with_n_while_ring_stays_flat() -> None:
    def seconds(comm: str, n: int) -> float:
        config = SimConfig(algorithm="allreduce", comm=comm, workers=n, steps=1, elements=1 << 24, alpha_s=5e-6)
        return run_simulated(config).summary["median_ms"]

    assert seconds("naive", 512) > 100 * seconds("naive", 4)
    assert seconds("ring", 512) < 2.5 * seconds("ring", 4)


def test_chen_backups_beat_full_sync_under_a_heavy_tail() -> None:
    from dsgd_teach.sim.papers import backups_vs_sync

    runs = backups_vs_sync(total=100, backups=4, steps=20)
    sync, backup = runs["100 sync"].summary, runs["96 + 4 backups"].summary
    assert backup["mean_step_ms"] < 0.8 * sync["mean_step_ms"]
    assert sync["cancelled"] == 0 and backup["cancelled"] > 0  # the late backups are cut short, never sent


def test_compression_shrinks_the_uplink_to_one_bit_per_entry() -> None:
    config = SimConfig(workers=2, steps=3, compression=True)
    trace = run_simulated(config).trace
    k = get_problem(config.problem).init_params.size
    assert (trace.query("event == 'gradient'").uplink_bytes == 16 + (k + 7) // 8).all()


def test_from_config_keeps_the_chapters_values() -> None:
    from dsgd_teach.collectives import AllreduceConfig
    from dsgd_teach.ps import DownpourConfig
    from dsgd_teach.syncasync import AsyncConfig, SyncConfig

    s = from_config(SyncConfig(workers=3, backups=1, steps=7, straggler="exponential", severity=0.1, lr=0.2))
    assert (s.algorithm, s.workers, s.backups, s.steps, s.straggler, s.severity, s.lr) == (
        "sync", 3, 1, 7, "exponential", 0.1, 0.2)
    a = from_config(AsyncConfig(workers=4, staleness_bound=2, staleness_aware=True), workers=400)
    assert (a.algorithm, a.workers, a.staleness_bound, a.staleness_aware) == ("async", 400, 2, True)
    d = from_config(DownpourConfig(replicas=3, shards=2, steps=10))
    assert (d.algorithm, d.workers, d.shards, d.steps) == ("async", 3, 2, 30)
    r = from_config(AllreduceConfig(workers=4, algorithm="doubling", elements=100, repeats=3))
    assert (r.algorithm, r.comm, r.elements, r.steps) == ("allreduce", "doubling", 100, 3)
    with pytest.raises(ValueError, match="don't know how to simulate"):
        from_config(object.__new__(type("Other", (), {"__dataclass_fields__": {}})))


def test_run_simulated_accepts_a_real_config_and_the_same_seed_gives_the_same_stragglers() -> None:
    from dsgd_teach.syncasync import SyncConfig

    real = SyncConfig(workers=3, steps=5, straggler="exponential", severity=0.2, seed=9)
    trace = run_simulated(real).trace.query("event == 'gradient'")
    model = real.delay_model()
    for _, row in trace.iterrows():
        assert row.injected_delay == model.delay(int(row.worker), int(row.step))


@pytest.mark.parametrize(
    ("changes", "field"),
    [({"workers": 1001}, "workers"), ({"backups": 5, "workers": 4}, "backups"), ({"algorithm": "x"}, "algorithm"),
     ({"alpha_s": -1.0}, "alpha_s"), ({"bandwidth_Bps": 0.0}, "bandwidth_Bps"), ({"comm": "star"}, "comm"),
     ({"mode": "real", "algorithm": "allreduce", "elements": 10}, "mode"),
     ({"delay_script": [[0.1]]}, "delay_script")],
)
def test_bad_values_name_their_field(changes: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        SimConfig(**changes)


def test_stop_requested_ends_the_run_early() -> None:
    seen = []

    def on_update(event: dict) -> None:
        seen.append(event)
        if len(seen) == 10:
            raise StopRequested

    result = run_simulated(SimConfig(workers=50, steps=100), on_update=on_update)
    assert result.stopped and len(seen) == 10 and len(result.trace) < 100


def test_calibration_recovers_the_machine_from_a_simulated_trace() -> None:
    from dsgd_teach.sim.calibrate import calibrate, fit_machine

    truth = SimConfig(workers=3, steps=60, compute_s=0.02, compute_cv=0.2, alpha_s=2e-3, bandwidth_Bps=None,
                      straggler="exponential", severity=0.01)
    traces = {n: run_simulated(truth.replace(workers=n)) for n in (1, 2, 4)}
    machine = fit_machine(traces[1].trace)
    assert machine["compute_s"] == pytest.approx(0.02, rel=0.1)
    assert machine["compute_cv"] == pytest.approx(0.2, rel=0.3)
    assert machine["alpha_s"] == pytest.approx(2e-3, rel=0.05)
    table, _ = calibrate(traces)
    assert ((table.ratio > 0.9) & (table.ratio < 1.1)).all()


def test_sharding_the_parameter_server_relieves_a_saturated_port() -> None:
    base = SimConfig(algorithm="async", workers=200, steps=1000, elements=1_000_000, compute_s=0.05,
                     bandwidth_Bps=1e10)
    one, four = run_simulated(base).summary, run_simulated(base.replace(shards=4)).summary
    assert 0.9 < one["server_port_busy"] <= 1.0 + 1e-9  # one port moves every byte: saturated
    assert four["updates_per_s"] > 1.5 * one["updates_per_s"]
    assert four["bytes_sent"] == one["bytes_sent"] == 1000 * 2 * 4_000_000
