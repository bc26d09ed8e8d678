"""Chapter 10's predictions against the papers' equations, PyTorch's own counters, and hand-computed values.

Each formula of transformer/predict.py is checked three ways where it can be: the equation it cites, evaluated by
hand on the paper's own example sizes; what the single-process model really does (torch's FLOP counter, its
parameters, the bytes autograd keeps); and simple cases worked out here.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from dsgd_teach.collectives.cost_model import AlphaBeta
from dsgd_teach.transformer.calibration import Calibration, layouts, predict_step, rank_layouts, saved_bytes
from dsgd_teach.transformer.model import GPTShape, build_gpt, count_params, lm_loss
from dsgd_teach.transformer.predict import (
    Plan,
    activation_bytes,
    axis_bytes,
    axis_elements,
    axis_messages,
    flops_per_step,
    flops_per_token,
    layer_activations,
    memory_per_rank,
    model_state_bytes,
    param_count,
    stage_params,
)

#: Dense shapes, and mixtures of experts whose capacity keeps every token (so every token runs top-k experts).
SHAPES = [GPTShape(), GPTShape(vocab=128, seq_len=64, width=96, heads=6, layers=3, mlp_ratio=2),
          GPTShape(experts=4, top_k=2, capacity_factor=8.0), GPTShape(experts=4, top_k=1, capacity_factor=4.0)]


@pytest.mark.parametrize("shape", SHAPES)
def test_param_count_is_the_models(shape):
    assert param_count(shape) == count_params(build_gpt(shape, 0))


@pytest.mark.parametrize("shape", SHAPES)
def test_flops_equal_torchs_flop_counter_on_the_model(shape):
    """6 Ψ + 12 L s h per token is what the model's matmuls do, forward and backward, to the FLOP."""
    model, batch = build_gpt(shape, 0), 3
    tokens = torch.randint(0, shape.vocab, (batch, shape.seq_len), generator=torch.Generator().manual_seed(0))
    with FlopCounterMode(display=False) as counter:
        lm_loss(model(tokens), tokens).backward()
    assert flops_per_step(shape, batch) == counter.get_total_flops()


def test_flops_with_recompute_are_narayanan_eq_3_on_their_39b_model():
    """Narayanan et al. 2021, eq. 3: 96 B s l h² (1 + s/(6h) + V/(16 l h)), their Table 1's 39.1B row (h 8192,
    l 48, a 64; V 51200, s 2048, B 1536). Biases are not in eq. 3 (nor in our matmul count)."""
    h, layers, s, vocab, batch = 8192, 48, 2048, 51200, 1536
    shape = GPTShape(vocab=vocab, seq_len=s, width=h, heads=64, layers=layers)
    eq3 = 96 * batch * s * layers * h**2 * (1 + s / (6 * h) + vocab / (16 * layers * h))
    assert flops_per_step(shape, batch, recompute=True) == pytest.approx(eq3, rel=1e-12)
    # and without recomputation, Kaplan et al.'s 6N per token plus the attention and head terms
    n = 12 * layers * h**2
    assert flops_per_token(shape) == 6 * n + 12 * layers * s * h + 6 * h * vocab


def test_layer_activations_are_korthikantis_equations():
    """Korthikanti et al. 2022: eq. 1 s b h (34 + 5 a s/h); Table 2: tensor parallel s b h (10 + 24/t + 5 a s/(h t)),
    with sequence parallelism s b h/t (34 + 5 a s/h). Their GPT-3 sizes: s 2048, h 12288, a 96, t 8, b 1."""
    s, b, h, a, t = 2048, 1, 12288, 96, 8
    assert layer_activations(s, b, h, a) == s * b * h * (34 + 5 * a * s / h)
    assert layer_activations(s, b, h, a, tp=t) == pytest.approx(s * b * h * (10 + 24 / t + 5 * a * s / (h * t)))
    assert layer_activations(s, b, h, a, tp=t, sequence_parallel=True) == pytest.approx(
        s * b * h / t * (34 + 5 * a * s / h))
    # fp32 without dropout: 16 elements of s b h and one of a s² b, 4 bytes each
    assert layer_activations(s, b, h, a, itemsize=4, dropout=False) == 4 * (16 * s * b * h + a * s * s * b)


@pytest.mark.parametrize("shape", SHAPES)
def test_activation_bytes_match_what_autograd_keeps(shape):
    """The single-process model's saved tensors (one copy per storage) are the formula's and at most 2 % more (the
    norms' means and inverse deviations, the causal mask, the token ids, the router's choices: terms of s b, s²,
    s b E, not s b h); with experts whose capacity keeps every token, each token's top-k rows."""
    for batch in (1, 4):
        measured, formula = saved_bytes(shape, batch), activation_bytes(shape, Plan(batch=batch))
        assert formula <= measured <= 1.02 * formula


def test_model_states_are_chapter_09s_adam():
    assert model_state_bytes(1000)["total"] == 16_000  # fp32 Adam: 4Ψ + 4Ψ + 8Ψ
    assert model_state_bytes(1000, "sgd")["total"] == 8_000
    shape = GPTShape()
    mem = memory_per_rank(shape, Plan(batch=4))
    assert mem["params"] == 4 * param_count(shape)
    assert mem["total"] == pytest.approx(16 * param_count(shape) + activation_bytes(shape, Plan(batch=4)))


def test_stage_params_add_up_to_the_model():
    """Split over p stages and N_tp tensor ranks, the parts hold the whole model (norms and row biases whole)."""
    shape = GPTShape(layers=4)
    assert sum(stage_params(shape, Plan(pp=4, batch=4, microbatches=1), st) for st in range(4)) == param_count(shape)
    h, t, layers = shape.width, 2, shape.layers
    replicated = layers * (4 * h + 2 * h) + 2 * h + 2 * shape.vocab * h + shape.seq_len * h  # norms, proj biases,...
    split = param_count(shape) - replicated
    assert stage_params(shape, Plan(tp=t, batch=4), 0) == split // t + replicated


def test_bytes_per_axis_by_hand():
    """GPTShape() (V 64, s 32, h 64, a 4, L 2), B = 8 on hand-worked layouts, in elements then fp32 bytes."""
    shape = GPTShape()
    psi = param_count(shape)
    dp4 = axis_elements(shape, Plan(dp=4, batch=8))
    assert dp4["dp"] == 2 * 3 / 4 * psi and dp4["tp"] == dp4["pp"] == dp4["cp"] == 0
    # tp 2: 4 allreduces per layer of b s h = 8·32·64, each 2(2-1)/2 of it in 2(2-1) messages
    assert axis_elements(shape, Plan(tp=2, batch=8))["tp"] == 4 * 2 * (8 * 32 * 64)
    assert axis_messages(shape, Plan(tp=2, batch=8))["tp"][0] == 4 * 2 * 2
    assert axis_messages(shape, Plan(dp=4, batch=8))["dp"][0] == 2 * 3
    assert axis_messages(shape, Plan(cp=4, batch=8))["cp"][0] == 2 * (2 * 4 - 1) + 2 * 3
    # pp 2, m 4: stage 0 sends 4 activations of b s h = 2·32·64, stage 1 the same number of gradients
    for stage in (0, 1):
        assert axis_elements(shape, Plan(pp=2, batch=8, microbatches=4), stage)["pp"] == 4 * 2 * 32 * 64
    # cp 2: per layer (6·1 + 2) blocks of b (s/2) h, plus the weights' gradients' ring allreduce
    assert axis_elements(shape, Plan(cp=2, batch=8))["cp"] == 2 * 8 * (8 * 16 * 64) + psi
    assert axis_bytes(shape, Plan(dp=4, batch=8))["dp"] == 4 * dp4["dp"]


def test_plan_rejects_bad_values_naming_the_field():
    with pytest.raises(ValueError, match="tp"):
        Plan(tp=0)
    with pytest.raises(ValueError, match="batch"):
        Plan(dp=3, batch=8)
    with pytest.raises(ValueError, match="ep must divide dp"):
        Plan(dp=2, ep=4, batch=8)
    with pytest.raises(ValueError, match="heads"):
        Plan(tp=3, batch=6).check_shape(GPTShape())
    with pytest.raises(ValueError, match="layers"):
        Plan(pp=4, batch=8).check_shape(GPTShape(layers=2))


def test_ranking_covers_every_layout_and_sorts_by_predicted_time():
    shape = GPTShape()
    cal = Calibration(flops_per_s=2e9, overhead_s=1e-4, cores=2, link=AlphaBeta(5e-5, 1e-9))
    plans = layouts(8, shape, 16, microbatches=4)
    assert plans and all(p.ranks == 8 for p in plans)
    assert len({(p.dp, p.tp, p.pp, p.cp, p.ep) for p in plans}) == len(plans)
    table = rank_layouts(shape, 8, 16, cal)
    assert len(table) == len(plans) and table.step_s.is_monotonic_increasing
    # a link with no cost leaves compute and bubble only; the bubble is (p-1)/m of the compute
    free = Calibration(2e9, 0.0, 8, AlphaBeta(0.0, 0.0))
    step = predict_step(shape, Plan(pp=2, dp=4, batch=16, microbatches=4), free)
    assert step["compute_s"] == pytest.approx(flops_per_step(shape, 16) / 8 / 2e9)
    assert step["step_s"] == pytest.approx(step["compute_s"] * (1 + 1 / 4))
    assert math.isclose(sum(step[k] for k in step if k not in ("step_s",)), step["step_s"])


def test_each_axis_is_priced_on_the_busy_link_measured_for_its_ranks_and_ring():
    shape = GPTShape()
    idle, two, pairs, four = (AlphaBeta(5e-5, 1e-10), AlphaBeta(1e-3, 1e-9), AlphaBeta(3e-3, 5e-9),
                              AlphaBeta(2e-3, 2e-9))
    cal = Calibration(2e9, 1e-4, 2, idle, busy_links=((2, 2, two), (4, 2, pairs), (4, 4, four)))
    assert cal.link_for(2) == two and cal.link_for(2, 2) == two and cal.link_for(1) == two  # fewest when none below
    assert cal.link_for(4) == four and cal.link_for(4, 2) == pairs and cal.link_for(8, 2) == pairs
    assert cal.link_for(4, 3) == pairs  # the largest ring not above the axis
    assert Calibration(2e9, 1e-4, 2, idle).link_for(4, 2) == idle  # nothing measured: the ping-pong's
    plan = Plan(dp=2, tp=2, batch=8)  # two rings of 2 on each axis among 4 busy ranks
    step = predict_step(shape, plan, cal)
    from dsgd_teach.transformer.calibration import worst_messages
    for axis in ("dp", "tp"):
        msgs, elements = worst_messages(shape, plan)[axis]
        assert step[f"{axis}_s"] == pytest.approx(pairs.alpha * msgs + pairs.beta * elements * 4)
    assert step["loss_sum_s"] == pytest.approx(pairs.alpha * 2)  # one number summed over the data axis's 2 ranks


def test_ring_attention_blocks_and_the_measured_share_enter_the_compute():
    from dataclasses import replace

    shape = GPTShape()
    base = Calibration(2e9, 1e-3, 2, AlphaBeta(0.0, 0.0))
    cal = replace(base, shares=((2, 1.5),), ring_fixed_s=1e-3, ring_block_s=2e-4)
    balanced, contiguous = Plan(cp=2, batch=8), Plan(cp=4, balanced=False, batch=8)
    assert cal.ring_attention_s(balanced) == pytest.approx(1e-3 + 5 * 2e-4)  # 2 N_cp + 1 blocks on every rank
    assert cal.ring_attention_s(contiguous) == pytest.approx(1e-3 + 4 * 2e-4)  # the last rank's N_cp blocks
    assert cal.ring_attention_s(Plan(dp=2, batch=8)) == 0.0
    want = (flops_per_step(shape, 8) / 2 / 2e9 + (1e-3 + 2e-3) * shape.layers) * 1.5
    assert predict_step(shape, balanced, cal)["compute_s"] == pytest.approx(want)
    assert cal.share_for(2) == 1.5 and cal.share_for(4) == 2.0 and cal.share_for(1) == 1.0  # N/cores unmeasured
    assert predict_step(shape, balanced, base)["compute_s"] < want  # without the blocks and the share
