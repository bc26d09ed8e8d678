"""Chapter 09's single-process pieces: activation checkpointing, the will-it-fit calculator, Goyal et al.'s rule."""

from __future__ import annotations

import numpy as np
import pytest

from dsgd_teach.sharded.checkpoint import measure, segments
from dsgd_teach.sharded.fit import Model, activations, model_states, will_it_fit
from dsgd_teach.sharded.scaling import ScalingConfig, goyal_lr, train
from dsgd_teach.sharded.toy import make_mlp
from dsgd_teach.sharded.zero import zero_formula

pytestmark = pytest.mark.timeout(60)


def test_checkpointing_keeps_the_gradient_and_saves_only_segment_inputs():
    runs = {how: measure(width=64, depth=8, rows=64, how=how, n_segments=4, repeats=1) for how in ("none", "manual", "torch")}
    rows, width = 64, 64
    for how in ("manual", "torch"):
        np.testing.assert_allclose(runs[how]["grad"], runs["none"]["grad"], rtol=0, atol=1e-6)
        # four segment inputs (the first is the 32-wide data) are all that is kept
        assert runs[how]["activation_bytes"] == 4 * rows * (32 + 3 * width), how
    assert runs["none"]["activation_bytes"] > 4 * runs["manual"]["activation_bytes"]
    assert [len(s) for s in segments(make_mlp(8, 8), 4)] == [4, 4, 4, 3]


def test_model_states_are_rajbhandari_and_the_calculator_adds_activations():
    for stage in range(4):
        assert model_states(1e9, 64, stage)["total"] == zero_formula(1e9, 64, stage)["total"]
    assert model_states(1e9, 8, 0, "fp32")["total"] == 16e9
    seventy = Model(80, 8192, 64)
    assert 64e9 < seventy.params < 66e9
    full = activations(seventy, 1, 2048, checkpoint=False)
    assert full == 80 * 2048 * 8192 * (34 + 5 * 64 * 2048 / 8192)
    assert activations(seventy, 1, 2048, checkpoint=True) == 80 * 2 * 2048 * 8192
    assert not will_it_fit(seventy, 1024, 2, checkpoint=True)["fits"]  # 2 Psi of bf16 parameters alone: 120 GiB
    assert will_it_fit(seventy, 64, 3, checkpoint=True)["fits"]
    assert will_it_fit(seventy, 64, 3)["sent_gib_per_step"] == pytest.approx(1.5 * will_it_fit(seventy, 64, 2)["sent_gib_per_step"])


def test_linear_scaling_with_warmup():
    assert goyal_lr(0, 0.1, 256, 8192, 100) == pytest.approx(0.1)
    assert goyal_lr(50, 0.1, 256, 8192, 100) == pytest.approx(0.1 + 0.5 * (3.2 - 0.1))
    assert goyal_lr(100, 0.1, 256, 8192, 100) == pytest.approx(3.2)
    assert goyal_lr(0, 0.1, 256, 512, 0) == pytest.approx(0.2)
    rows = train(ScalingConfig(samples=256, base_batch=8), 32, warmup=True)
    lrs = [r["lr"] for r in rows if "lr" in r]
    assert lrs[0] == pytest.approx(0.05) and lrs[-1] == pytest.approx(0.2) and len(lrs) == 8
    with pytest.raises(ValueError, match="warmup_fraction"):
        ScalingConfig(warmup_fraction=2.0)
