"""The at-scale ZeRO simulator: chapter 09's memory and traffic accounting, the α–β ring's time, 70B on 80 GB."""

from __future__ import annotations

import pytest

from dsgd_teach.sharded import ZeroConfig, run_zero
from dsgd_teach.sharded.fit import GIB, Model, will_it_fit
from dsgd_teach.sim import (
    ShardedSimConfig,
    fewest_gpus,
    ring_closed_form,
    sharded_sweep,
    simulate_sharded_step,
)

pytestmark = pytest.mark.timeout(120)

SEVENTY = Model(80, 8192, 64, vocab=32_000)  # Llama 2 70B's layers, hidden size and heads
PAPER_STATES = {0: lambda p, n: 16 * p, 1: lambda p, n: 4 * p + 12 * p / n, 2: lambda p, n: 2 * p + 14 * p / n,
                3: lambda p, n: 16 * p / n}  # Rajbhandari et al. 2020, mixed-precision Adam, bytes per GPU


@pytest.mark.parametrize("n", [1, 2, 64, 1024])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_memory_per_gpu_is_chapter_09s_accounting(stage, n):
    for fields in ({}, {"checkpoint": False, "seq": 2048, "microbatch": 2}, {"precision": "fp32"}):
        c = ShardedSimConfig(model="70B", workers=n, stage=stage, **fields)
        row = simulate_sharded_step(c)
        fit = will_it_fit(SEVENTY, n, stage, c.microbatch, c.seq, c.checkpoint, c.precision, c.gpu_gib)
        for key in ("states_gib", "activations_gib", "total_gib", "fits"):
            assert row[key] == fit[key], (fields, key, row[key], fit[key])
        assert row["params"] == SEVENTY.params
    row = simulate_sharded_step(ShardedSimConfig(workers=n, stage=stage))
    assert row["states_gib"] * GIB == pytest.approx(PAPER_STATES[stage](SEVENTY.params, n), rel=1e-12)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_bytes_sent_are_two_or_three_psi(stage):
    for n in (1, 2, 3, 64, 1000, 1024):
        for precision, elem in (("mixed", 2), ("fp32", 4)):
            row = simulate_sharded_step(ShardedSimConfig(workers=n, stage=stage, precision=precision))
            psi = row["params"]
            copies = 3 if stage == 3 else 2
            assert row["sent_bytes"] == pytest.approx(copies * psi * (n - 1) / n * elem, rel=1e-12), (n, precision)
            fit = will_it_fit(SEVENTY, n, stage, precision=precision)
            assert row["sent_bytes"] == fit["sent_gib_per_step"] * GIB


def test_communication_is_the_rings_closed_form():
    """Stages 0-2: 2(N-1)α + 2(N-1)/N K β with K the gradient's bytes; stage 3 adds a third of that (a gather)."""
    alpha, bandwidth, psi = 7e-6, 20e9, 3 * 2**30  # Ψ divisible by every N below: equal chunks, as the formula
    for n in (2, 3, 4, 6, 64, 1024):
        for stage in range(4):
            row = simulate_sharded_step(ShardedSimConfig(workers=n, stage=stage, params=psi, alpha_s=alpha,
                                                         bandwidth_Bps=bandwidth))
            ring = 2 * (n - 1) * alpha + 2 * (n - 1) / n * (2 * psi) / bandwidth
            assert ring == pytest.approx(ring_closed_form(alpha, bandwidth, n, 2 * psi), rel=1e-12)
            assert row["comm_s"] == pytest.approx(ring * (1.5 if stage == 3 else 1.0), rel=1e-12), (n, stage)
    for n in (2, 64, 1024):  # the 70B model itself: chunks of ceil(Ψ/N), off by less than one element each
        row = simulate_sharded_step(ShardedSimConfig(workers=n, stage=1, alpha_s=alpha, bandwidth_Bps=bandwidth))
        assert row["comm_s"] == pytest.approx(ring_closed_form(alpha, bandwidth, n, 2 * row["params"]), rel=1e-7)
    assert simulate_sharded_step(ShardedSimConfig(workers=1))["comm_s"] == 0.0


def test_only_ddp_hides_all_its_traffic_in_backward():
    """ZeRO-1/2 all-gather the parameters after the optimizer step (Rajbhandari et al. 2020, section 7.2.1), so that
    gather cannot run under backward; overlapped, stages 1-3 lose the same time, plain DDP none."""
    rows = {s: simulate_sharded_step(ShardedSimConfig(workers=1024, stage=s)) for s in range(4)}
    assert rows[0]["step_s"] == pytest.approx(rows[0]["compute_s"])  # 2 phases under an 8Ψ-per-token backward
    assert rows[1]["step_s"] == pytest.approx(rows[2]["step_s"]) == pytest.approx(rows[3]["step_s"])
    assert rows[1]["exposed_comm_s"] > 1.0


def test_compute_and_overlap():
    """6Ψ FLOPs per token (8Ψ with recomputation); overlap hides each pass's traffic behind that pass's compute."""
    for checkpoint, flops in ((False, 6), (True, 8)):
        c = ShardedSimConfig(workers=256, stage=3, checkpoint=checkpoint, microbatch=2, seq=1024, overlap=False)
        row = simulate_sharded_step(c)
        assert row["compute_s"] == pytest.approx(flops * c.psi * 2 * 1024 / c.flop_s, rel=1e-12)
        assert row["step_s"] == pytest.approx(row["compute_s"] + row["comm_s"], rel=1e-12)
        hidden = simulate_sharded_step(c.replace(overlap=True))
        forward, backward = 2 / flops * row["compute_s"], (flops - 2) / flops * row["compute_s"]
        expect = max(forward, row["comm_s"] / 3) + max(backward, row["comm_s"] * 2 / 3)
        assert hidden["step_s"] == pytest.approx(expect, rel=1e-12)
        assert row["compute_s"] <= hidden["step_s"] < row["step_s"]
    # a forward pass shorter than its all-gather, a backward pass longer than its traffic: only the first shows
    c = ShardedSimConfig(workers=256, stage=3, checkpoint=True)
    third = simulate_sharded_step(c)["comm_s"] / 3
    row = simulate_sharded_step(c.replace(flop_s=2 * c.psi * c.seq / (0.8 * third)))  # forward: 0.8 of a gather
    assert row["exposed_comm_s"] == pytest.approx(0.2 * third, rel=1e-9)
    table = sharded_sweep(workers=(1, 8, 1024), stages=(0, 3))
    assert len(table) == 2 * 3 * 2 and set(table.columns) >= {"total_gib", "fits", "sent_bytes", "step_s"}


def test_a_70b_model_fits_on_80_gib_only_with_zero_3():
    table = fewest_gpus("70B")
    assert table.fewest_gpus.isna().tolist() == [True, True, True, False]
    n = int(table.fewest_gpus.iloc[3])
    c = ShardedSimConfig()
    fit = [will_it_fit(SEVENTY, m, 3, c.microbatch, c.seq, c.checkpoint, gpu_gib=80.0)["fits"] for m in (n - 1, n)]
    assert fit == [False, True] and n == 15  # with the layer rebuilt in backward and ZeRO-3's buffers
    there = simulate_sharded_step(c.replace(workers=n))
    assert there["rebuilt_gib"] == pytest.approx(4096 * 8192 * (34 + 5 * 64 * 4096 / 8192) / GIB)  # s b h (34 + 5as/h)
    assert there["buffers_gib"] == pytest.approx((2 + 2 * 2) * 12 * 8192**2 / GIB)  # a unit's gradient, two gathered
    bare = there["total_gib"] - there["rebuilt_gib"] - there["buffers_gib"]
    assert bare < 80 and simulate_sharded_step(c.replace(workers=13))["total_gib"] > 80  # 13 only without them
    assert not will_it_fit(SEVENTY, 1024, 2, c.microbatch, c.seq, c.checkpoint)["fits"]  # 2Ψ of bf16 alone: 120 GiB
    assert fewest_gpus("70B", checkpoint=False).fewest_gpus.isna().all()  # s b h (34 + 5as/h) per layer: 485 GiB


@pytest.mark.parametrize(("field", "value"), [
    ("model", "175B"), ("workers", 0), ("workers", 1025), ("stage", 4), ("precision", "fp8"), ("microbatch", 0),
    ("seq", 0), ("checkpoint", "yes"), ("overlap", 1), ("gpu_gib", 0.0), ("flop_s", -1.0), ("alpha_s", -1e-6),
    ("bandwidth_Bps", 0.0), ("params", 0),
])
def test_config_names_the_bad_field_and_its_range(field, value):
    with pytest.raises(ValueError, match=rf"^{field} must be") as err:
        ShardedSimConfig(**{field: value})
    assert any(word in str(err.value) for word in ("[", "(", "one of", "True or False")), err.value


def test_accounting_matches_chapter_09s_measured_bytes(client):
    """Chapter 09's ZeRO runs (bf16, test_sharded_zero's MLP) at N = 2 and 4: the simulator, given their padded Ψ,
    predicts the model-state bytes each rank held at the optimizer step and the elements it sent, exactly."""
    try:
        for n in (2, 4):
            if n == 4:
                client.resize(4)
            for stage in range(4):
                measured = run_zero(ZeroConfig(workers=n, stage=stage, precision="bf16", steps=2, depth=6,
                                               batch_size=64), client).summary
                row = simulate_sharded_step(ShardedSimConfig(workers=n, stage=stage, params=measured["psi"]))
                held, sent = measured["held_bytes"], measured["elements_sent"]
                assert row["states_gib"] * GIB == held, (n, stage, row["states_gib"] * GIB, held)
                assert row["sent_bytes"] == 2 * sent, (n, stage, row["sent_bytes"], 2 * sent)
    finally:
        client.resize(2)
