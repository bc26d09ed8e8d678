"""Chapter 04 oracles without a cluster: delay models, first-N aggregation, the staleness gate, 1-bit SGD."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsgd_teach.syncasync import (
    AsyncConfig,
    DelayModel,
    OneBitCompressor,
    StalenessGate,
    SyncConfig,
    SyncRound,
    quantize,
    simulate_async,
)
from dsgd_teach.syncasync.actors import AsyncServer, SyncCoordinator

pytestmark = pytest.mark.timeout(60)


# ----------------------------------------------------------------------------------------------- delay models
def test_delay_models_are_deterministic_and_shaped() -> None:
    assert DelayModel("none", 0.5, 0, 4).delay(3, 7) == 0.0
    slow = DelayModel("slow_worker", 0.25, 0, 4)
    assert [slow.delay(r, 5) for r in range(4)] == [0.0, 0.0, 0.0, 0.25]
    expo = DelayModel("exponential", 0.01, 3, 2)
    assert expo.delay(1, 9) == expo.delay(1, 9) != expo.delay(0, 9)
    for kind in ("exponential", "lognormal"):
        model = DelayModel(kind, 0.01, 1, 8)
        draws = np.array([model.delay(r, s) for r in range(8) for s in range(1500)])
        assert draws.min() >= 0
        assert abs(draws.mean() - 0.01) < 0.0015, (kind, draws.mean())
    heavy = np.array([DelayModel("lognormal", 0.01, 2, 1).delay(0, s) for s in range(4000)])
    assert np.quantile(heavy, 0.99) > 5 * np.median(heavy) * 3  # a heavy tail: p99 far beyond the median


def test_delay_script_overrides_the_model() -> None:
    model = DelayModel("exponential", 0.5, 0, 2, ((0.1, 0.0), (0.0,)))
    assert [model.delay(0, 0), model.delay(0, 1), model.delay(0, 2), model.delay(1, 0)] == [0.1, 0.0, 0.0, 0.0]


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"kind": "gamma"}, "straggler"),
        ({"severity": -1.0}, "severity"),
        ({"severity": float("nan")}, "severity"),
        ({"world": 2, "script": ((0.1,),)}, "delay_script"),
        ({"world": 1, "script": ((-0.1,),)}, "delay_script"),
    ],
)
def test_delay_model_rejects_bad_inputs(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        DelayModel(**kwargs)


# ----------------------------------------------------------------------------------------------- configs
@pytest.mark.parametrize(
    "cls, kwargs, field",
    [
        (SyncConfig, {"workers": 2, "backups": 3}, "backups"),
        (SyncConfig, {"workers": 0}, "workers"),
        (SyncConfig, {"backups": -1}, "backups"),
        (SyncConfig, {"straggler": "slow"}, "straggler"),
        (SyncConfig, {"compression": 1}, "compression"),
        (SyncConfig, {"error_feedback": "yes"}, "error_feedback"),
        (SyncConfig, {"lr": 0.0}, "lr"),
        (SyncConfig, {"workers": 2, "backups": 1, "delay_script": [[0.1], [0.1]]}, "delay_script"),
        (SyncConfig, {"delay_script": 5}, "delay_script"),
        (AsyncConfig, {"staleness_bound": -1}, "staleness_bound"),
        (AsyncConfig, {"staleness_aware": None}, "staleness_aware"),
        (AsyncConfig, {"server": "redis"}, "server"),
        (AsyncConfig, {"server": "ps", "staleness_bound": 2}, "server"),
        (AsyncConfig, {"timeout_s": 0.0}, "timeout_s"),
    ],
)
def test_configs_reject_bad_inputs(cls: type, kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        cls(**kwargs)


def test_config_world_counts_backups_and_script_is_frozen() -> None:
    config = SyncConfig(workers=3, backups=2, delay_script=[[0.0]] * 5)
    assert config.world == 5
    assert config.delay_script == ((0.0,),) * 5
    hash(config)


# ----------------------------------------------------------------------------------------------- first N of N+b
@given(st.permutations(list(range(5))), st.integers(1, 5))
@settings(max_examples=60, deadline=None)
def test_sync_round_aggregates_exactly_the_first_n_arrivals(order: list[int], needed: int) -> None:
    rnd = SyncRound(needed, 5)
    verdicts = {}
    for rank in order:
        verdicts[rank] = rnd.arrive(rank, 0)
        if rnd.complete and rnd.version == 0:
            log = rnd.advance()
    assert log.aggregated == order[:needed]
    assert sorted(r for r, v in verdicts.items() if v == "aggregated") == sorted(order[:needed])
    assert log.discarded == order[needed:]
    assert rnd.logs[1].arrivals == []  # nothing from step 0 leaked into step 1


def test_sync_round_rejects_future_and_unknown() -> None:
    rnd = SyncRound(2, 3)
    with pytest.raises(ValueError, match="future"):
        rnd.arrive(0, 1)
    with pytest.raises(ValueError, match="rank"):
        rnd.arrive(3, 0)
    with pytest.raises(RuntimeError):
        rnd.advance()
    with pytest.raises(ValueError, match="needed"):
        SyncRound(4, 3)


def test_sync_coordinator_applies_mean_of_first_n_and_never_mixes_late_ones() -> None:
    w0 = np.zeros(3, np.float32)
    g = {r: np.eye(3, dtype=np.float32)[r] * (r + 1) for r in range(3)}

    async def script() -> tuple[np.ndarray, list]:
        coord = SyncCoordinator(w0, needed=2, world=3, lr=1.0, steps=2, slice_s=0.01)
        out = []
        for rank in (2, 0):  # first two arrivals of step 0
            out.append((await coord.push(rank, 0, g[rank], 8, 1.0, 0.0))[0])
        out.append((await coord.push(1, 0, g[1], 8, 1.0, 0.0))[0])  # late: discarded
        for rank in (1, 0):
            out.append((await coord.push(rank, 1, g[rank], 8, 1.0, 0.0))[0])
        params, rows, logs = await coord.report()
        return params, out, logs

    params, verdicts, logs = asyncio.run(script())
    assert verdicts == ["aggregated", "aggregated", "discarded", "aggregated", "aggregated"]
    expected = w0 - (g[2] + g[0]) / 2 - (g[1] + g[0]) / 2
    np.testing.assert_allclose(params, expected, rtol=0, atol=1e-7)
    assert logs[0].aggregated == [2, 0] and logs[0].discarded == [1] and logs[1].aggregated == [1, 0]


# ----------------------------------------------------------------------------------------------- staleness
durations = st.lists(
    st.lists(st.floats(0.01, 10.0, allow_nan=False), min_size=1, max_size=25), min_size=1, max_size=5
)


@given(durations, st.integers(0, 6))
@settings(max_examples=150, deadline=None)
def test_bounded_staleness_never_exceeded_and_never_deadlocks(script: list[list[float]], bound: int) -> None:
    writes = simulate_async(script, bound)
    assert len(writes) == sum(len(d) for d in script)  # everyone finished: no deadlock, nothing dropped
    assert [w[2] for w in writes] == list(range(1, len(writes) + 1))
    for _worker, read, applied, staleness in writes:
        assert staleness == applied - 1 - read
        assert 0 <= staleness <= bound


@given(durations)
@settings(max_examples=50, deadline=None)
def test_unbounded_gate_never_blocks(script: list[list[float]]) -> None:
    writes = simulate_async(script, None)
    per_worker_end = {}
    for w, *_ in writes:
        per_worker_end[w] = per_worker_end.get(w, 0) + 1
    assert per_worker_end == {w: len(d) for w, d in enumerate(script)}


@pytest.mark.parametrize("n", [2, 4, 6])
def test_plain_async_mean_staleness_is_about_n_minus_1(n: int) -> None:
    means = []
    for seed in range(5):
        rng = np.random.default_rng(seed)
        writes = simulate_async(rng.exponential(1.0, size=(n, 400)), None)
        means.append(np.mean([w[3] for w in writes]))
    assert abs(np.mean(means) - (n - 1)) < 0.1 * n


def test_gate_rejects_misuse() -> None:
    gate = StalenessGate(1)
    gate.read(0)
    with pytest.raises(ValueError, match="already"):
        gate.read(0)
    with pytest.raises(ValueError, match="without a read"):
        gate.write(5)
    with pytest.raises(ValueError, match="bound"):
        StalenessGate(-1)


def test_async_server_accounting_on_a_scripted_interleaving() -> None:
    w0 = np.zeros(4, np.float32)
    e = np.eye(4, dtype=np.float32)

    async def script(aware: bool) -> tuple[list[tuple[int, int, int]], np.ndarray]:
        server = AsyncServer(w0, lr=1.0, updates=10, bound=None, staleness_aware=aware, slice_s=0.01)
        seen = []

        async def push(rank: int, g: np.ndarray) -> None:
            r = await server.push(rank, g)
            seen.append((r["version_read"], r["version_applied"], r["staleness"]))

        assert (await server.pull(0))[1] == 0  # A reads v0
        assert (await server.pull(1))[1] == 0  # B reads v0
        await push(1, e[1])  # B writes: v1, staleness 0
        assert (await server.pull(2))[1] == 1  # C reads v1
        assert (await server.pull(3))[1] == 1  # D reads v1
        await push(0, e[0])  # A writes: v2, staleness 1
        await push(3, e[3])  # D writes: v3, staleness 1
        await push(2, e[2])  # C writes: v4, staleness 2
        assert (await server.pull(1))[1] == 4
        await push(1, e[1])  # B writes: v5, staleness 0
        return seen, (await server.report())[0]

    seen, params = asyncio.run(script(False))
    assert seen == [(0, 1, 0), (0, 2, 1), (1, 3, 1), (1, 4, 2), (4, 5, 0)]
    np.testing.assert_array_equal(params, -np.array([1, 2, 1, 1], np.float32))
    _, params = asyncio.run(script(True))  # lr / (staleness + 1)
    np.testing.assert_allclose(params, -np.array([0.5, 2.0, 1 / 3, 0.5], np.float32), rtol=1e-6)


# ----------------------------------------------------------------------------------------------- 1-bit SGD
grads = st.integers(1, 40).flatmap(
    lambda n: st.lists(
        st.lists(st.floats(-100, 100, allow_nan=False, width=32), min_size=n, max_size=n), min_size=1, max_size=12
    )
)


@given(grads)
@settings(max_examples=80, deadline=None)
def test_one_bit_sent_plus_residual_equals_sum_of_true_gradients(seq: list[list[float]]) -> None:
    comp = OneBitCompressor(len(seq[0]), error_feedback=True)
    sent = np.zeros(len(seq[0]), np.float64)
    for g in seq:
        msg = comp.encode(np.array(g, np.float32))
        assert set(np.unique(msg.decode())) <= {np.float32(msg.pos), np.float32(msg.neg)}
        sent += msg.decode()
    truth = np.sum(np.array(seq, np.float32).astype(np.float64), axis=0)
    np.testing.assert_allclose(sent + comp.residual, truth, rtol=1e-6, atol=1e-3)


def test_without_error_feedback_the_loss_is_permanent() -> None:
    rng = np.random.default_rng(0)
    seq = rng.standard_normal((400, 64)).astype(np.float32) + 0.3
    off, on = OneBitCompressor(64, error_feedback=False), OneBitCompressor(64, error_feedback=True)
    sent_off = sum(off.encode(g).decode().astype(np.float64) for g in seq)
    sent_on = sum(on.encode(g).decode().astype(np.float64) for g in seq)
    truth = seq.astype(np.float64).sum(axis=0)
    assert np.all(off.residual == 0)
    err_off, err_on = np.linalg.norm(sent_off - truth), np.linalg.norm(sent_on - truth)
    assert err_off > 10 * err_on  # with feedback the gap stays one residual; without it, it keeps growing


def test_one_bit_message_size_and_exact_signs() -> None:
    v = np.array([3.0, -1.0, 5.0, -3.0, 0.0], np.float32)
    msg = quantize(v)
    assert msg.pos == pytest.approx(8.0 / 3) and msg.neg == pytest.approx(-2.0)
    np.testing.assert_allclose(msg.decode(), [8 / 3, -2, 8 / 3, -2, 8 / 3], rtol=1e-6)
    assert quantize(np.zeros(1000, np.float32)).nbytes == 125 + 16  # 1 bit per entry plus two scales and n


def test_compressor_rejects_bad_inputs() -> None:
    with pytest.raises(ValueError, match="n must"):
        OneBitCompressor(0)
    with pytest.raises(ValueError, match="entries"):
        OneBitCompressor(3).encode(np.zeros(4, np.float32))
