"""Chapter 10's layouts at scale (sim/transformer.py): the same numbers as chapter 10's own functions on small cases,
a two-level network that charges an axis the network's link only when its groups leave their node, and a ranking
that keeps only the layouts that fit."""

from __future__ import annotations

import math

import pytest

from dsgd_teach.collectives.cost_model import AlphaBeta
from dsgd_teach.sim.transformer import (
    GPT3,
    Cluster,
    PaperShape,
    ScalePlan,
    best_layouts,
    group_blocks,
    links_across_nodes,
    predict_at_scale,
    rank_at_scale,
)
from dsgd_teach.transformer.calibration import Calibration, predict_step, rank_layouts
from dsgd_teach.transformer.mesh import Layout
from dsgd_teach.transformer.model import GPTShape
from dsgd_teach.transformer.predict import LINKS, Plan, flops_per_token, memory_per_rank, param_count

pytestmark = pytest.mark.timeout(120)

SMALL = GPTShape(vocab=64, seq_len=32, width=64, heads=4, layers=4)
LINK = AlphaBeta(3e-5, 2e-9)


@pytest.mark.parametrize("kw", [dict(dp=2, tp=2, pp=2, microbatches=2), dict(tp=2, pp=2, cp=2, microbatches=4),
                                dict(dp=4, tp=2), dict(pp=4, microbatches=4, itemsize=2)])
def test_one_link_everywhere_is_chapter_10s_prediction_exactly(kw):
    """With the same link inside and between nodes, every term is calibration.predict_step's and the memory is
    memory_per_rank's busiest stage, to the last bit, whatever the node size."""
    plan = Plan(batch=8, **kw)
    wide = ScalePlan(batch=8, **kw)
    want = predict_step(SMALL, plan, Calibration(1e9, 0.0, plan.ranks, LINK))
    for per_node in (1, 2, 8):
        got = predict_at_scale(SMALL, wide, Cluster(gpus_per_node=per_node, flops_per_s=1e9, intra=LINK, inter=LINK))
        for key, value in want.items():
            assert got[key] == value, (kw, per_node, key)
        assert got["memory_bytes"] == max(memory_per_rank(SMALL, plan, st)["total"] for st in range(plan.pp))


def test_one_rank_per_node_puts_every_link_on_the_network():
    plan = ScalePlan(dp=2, tp=2, pp=2, batch=8, microbatches=2)
    slow = AlphaBeta(1e-4, 1e-8)
    got = predict_at_scale(SMALL, plan, Cluster(gpus_per_node=1, flops_per_s=1e9, intra=LINK, inter=slow))
    want = predict_step(SMALL, plan, Calibration(1e9, 0.0, plan.ranks, slow))
    assert {k: got[k] for k in want} == want
    assert got["across"] == "dp,edp,pp,tp"


def test_the_ranking_of_a_small_model_is_chapter_10s():
    """On one link and unlimited memory, every layout of chapter 10's ranking (the toy model on 8 ranks) gets the
    same step time and memory here, so the same order."""
    want = rank_layouts(SMALL, 8, 8, Calibration(1e9, 0.0, 8, LINK), microbatches=2)
    cluster = Cluster(flops_per_s=1e9, intra=LINK, inter=LINK, memory_gib=1e6)
    got = [predict_at_scale(SMALL, ScalePlan(dp=r.dp, tp=r.tp, pp=r.pp, cp=r.cp, ep=r.ep, batch=8, microbatches=r.m),
                            cluster) for r in want.itertuples()]
    assert len(want) > 5
    assert [g["step_s"] for g in got] == list(want.step_s)
    assert [g["memory_bytes"] for g in got] == list(want.memory_bytes)


def test_group_blocks_follow_chapter_10s_mesh_numbering():
    """The ranks one group spans are those of mesh.Layout's groups (tensor fastest, pipeline slowest)."""
    for kw in (dict(dp=2, tp=2, pp=2), dict(tp=2, pp=2, cp=2), dict(dp=4, ep=2, tp=2), dict(dp=8, ep=4)):
        layout = Layout(**kw)
        blocks = group_blocks(ScalePlan(batch=64, **kw))
        for link in LINKS:
            for group in layout.groups(link):
                if len(group) > 1:  # the group fills one aligned block of that many ranks, evenly spaced
                    assert len({r // blocks[link] for r in group}) == 1, (kw, link, group)
                    assert max(group) - min(group) + group[1] - group[0] == blocks[link], (kw, link, group)


def test_tensor_parallelism_across_nodes_ranks_below_it_inside_a_node():
    """The same layout with tensor groups of 16 on 16-GPU nodes and on 8-GPU nodes: only the tensor axis changes
    link, every other term is equal, and the step is slower."""
    shape, batch = GPT3["GPT-3 6.7B"]
    plan = ScalePlan(tp=16, pp=4, batch=batch, microbatches=batch, itemsize=2)
    inside = predict_at_scale(shape, plan, Cluster(gpus_per_node=16))
    across = predict_at_scale(shape, plan, Cluster(gpus_per_node=8))
    assert "tp" in across["across"].split(",") and "tp" not in inside["across"].split(",")
    assert across["tp_s"] > 5 * inside["tp_s"]
    for key in ("compute_s", "bubble_s", "pp_s", "dp_s", "memory_bytes"):
        assert across[key] == inside[key], key
    assert across["step_s"] > inside["step_s"]
    # and in a ranking on 8-GPU nodes, no layout with tensor groups across nodes beats the best one inside
    ranked = rank_at_scale(shape, 64, batch, Cluster(gpus_per_node=8))
    crossing = ranked.across.str.contains("tp")
    assert crossing.any() and not crossing.iloc[0]
    # swapping the order (tensor outermost) puts the same tp8 layout's tensor groups across nodes
    swapped = Cluster(order=("tp", "pp", "dp", "cp"))
    plan8 = ScalePlan(dp=8, tp=8, batch=batch, microbatches=batch // 8, itemsize=2)
    assert "tp" in links_across_nodes(plan8, swapped) and "tp" not in links_across_nodes(plan8, Cluster())
    assert predict_at_scale(shape, plan8, swapped)["tp_s"] > predict_at_scale(shape, plan8, Cluster())["tp_s"]


def test_a_layout_that_does_not_fit_is_left_out():
    shape, batch = GPT3["GPT-3 175B"]
    everything = rank_at_scale(shape, 64, batch, keep_all=True)
    fitting = rank_at_scale(shape, 64, batch)
    assert len(fitting) < len(everything) and fitting.fits.all()
    assert (fitting.memory_bytes <= 80 * 2**30).all()
    assert set(fitting.layout) == set(everything[everything.fits].layout)
    assert list(fitting.step_s) == sorted(fitting.step_s)
    # 175B's model states alone, 16 bytes per parameter in mixed-precision Adam, need 44 GPUs of 80 GB: none on 32
    assert len(rank_at_scale(shape, 32, batch)) == 0
    assert 16 * param_count(shape) / (80 * 2**30) > 32
    # a bigger GPU lets in layouts the 80 GB one kept out
    assert len(rank_at_scale(shape, 64, batch, Cluster(memory_gib=160.0))) > len(fitting)


def test_gpt3_175b_is_its_table_and_more_gpus_take_shorter_steps():
    shape, _ = GPT3["GPT-3 175B"]
    assert param_count(shape) == pytest.approx(175e9, rel=0.01)  # Brown et al. 2020, Table 2.1
    assert flops_per_token(shape) == pytest.approx(6 * param_count(shape), rel=0.05)
    best = best_layouts("GPT-3 175B", gpus=(256, 1024, 4096))
    assert list(best.gpus) == [256, 1024, 4096]
    assert list(best.step_s) == sorted(best.step_s, reverse=True)
    assert (best.tp <= 8).all()  # Narayanan et al. 2021, section 3.3: tensor parallelism inside the node


def test_bad_values_raise():
    with pytest.raises(ValueError, match="gpus_per_node"):
        Cluster(gpus_per_node=0)
    with pytest.raises(ValueError, match="order"):
        Cluster(order=("pp", "dp", "tp"))
    with pytest.raises(ValueError, match="at most 4096"):
        ScalePlan(dp=64, tp=128, batch=64 * 128)
    with pytest.raises(ValueError, match="heads"):
        PaperShape(width=100, heads=3)
    assert math.isfinite(predict_at_scale(SMALL, ScalePlan(batch=8), Cluster())["step_s"])
