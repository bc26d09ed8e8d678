"""Chapter 10's experiment: each run predicts, then measures; the traced bytes are the formulas exactly.

Oracles: every rank's bytes on every mesh axis in every step equal predict.axis_bytes for its coordinates (chapter
05's ring, Megatron's allreduces, sequence parallelism's gathers, the pipeline's boundaries, ring attention's
blocks); the memory each rank holds (parameters, gradients and the tensors autograd keeps) is within 10 % of
predict.memory_per_rank. No wall-clock assertion: the step time is compared in the chapter, not here.
"""

from __future__ import annotations

import pytest

from dsgd_teach.experiments import get
from dsgd_teach.runtime.clusters.cluster import start_client
from dsgd_teach.transformer.experiment import TransformerConfig, run
from dsgd_teach.transformer.mesh import AXES
from dsgd_teach.transformer.predict import axis_bytes, memory_per_rank
from dsgd_teach.transformer.traffic import axis_table

LAYOUTS = {
    "dp2-tp2-pp2": dict(dp=2, tp=2, pp=2),
    "tp2-pp2-cp2-sp": dict(tp=2, pp=2, cp=2, sequence_parallel=True),
}


@pytest.fixture(scope="module")
def runs():
    """Each layout run once (two steps) on an eight-worker cluster, with its printed output."""
    with start_client(8, quiet=True, use_gpu=False) as client:
        yield {name: run(TransformerConfig(**kw, steps=2, predict=False, verbose=False), client)
               for name, kw in LAYOUTS.items()}


def coords_of(result, rank: int) -> dict[str, int]:
    ups = result.trace[(result.trace.event == "update") & (result.trace.worker == rank)].iloc[0]
    return {axis: int(ups[axis]) for axis in (*AXES, "edp")}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_traced_bytes_per_rank_and_axis_equal_the_formulas(runs, name):
    result = runs[name]
    config = result.config
    table = axis_table(result.trace)
    assert len(table) == config.layout.world * config.steps
    for (rank, step), row in table.iterrows():
        at = coords_of(result, rank)
        want = axis_bytes(config.shape, config.plan, at["pp"], at)
        want = {axis: int(want[axis] + (want["edp"] if axis == "dp" else 0)) for axis in AXES}
        assert {axis: int(v) for axis, v in row.items()} == want, f"rank {rank} {at}, step {step}"
    assert sum(len(config.layout.active) >= 3 for config in (r.config for r in runs.values())) == len(runs)


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_memory_held_is_the_formulas_within_ten_percent(runs, name):
    result = runs[name]
    ups = result.trace[result.trace.event == "update"]
    for rank, rows in ups.groupby("worker"):
        held = float((rows.activation_bytes + rows.state_bytes).max())
        want = memory_per_rank(result.config.shape, result.config.plan, int(rows.pp.iloc[0]), "gpipe")["total"]
        assert held == pytest.approx(want, rel=0.10), f"rank {rank}"


def test_the_comparison_table_has_every_axis_that_sent(runs):
    table = runs["tp2-pp2-cp2-sp"].extras.comparison
    assert {"bytes sent on tp", "bytes sent on pp", "bytes sent on cp", "memory held (bytes)"} <= set(table.quantity)
    sent = table[table.quantity.str.startswith("bytes")]
    assert (sent.ratio == 1.0).all(), sent


def test_the_printed_prediction_names_the_layout_and_its_bytes():
    """What run prints before training (verbose); without a calibration it has no step time but all the bytes."""
    from dsgd_teach.transformer.experiment import describe_prediction, prediction

    config = TransformerConfig(dp=2, pp=2)
    text = describe_prediction(config, prediction(config, None))
    assert text.startswith("predicted for dp=2 tp=1 pp=2") and "bytes per rank per step" in text


def test_the_experiment_is_registered_and_validates_its_fields():
    assert get("transformer").config_cls is TransformerConfig
    with pytest.raises(ValueError, match="steps"):
        TransformerConfig(steps=0)
    with pytest.raises(ValueError, match="tp"):
        TransformerConfig(tp=3)
    with pytest.raises(ValueError, match="predict"):
        TransformerConfig(predict="yes")


def test_the_busy_links_are_measured_for_every_ring_size_among_the_ranks(cluster4):
    """Four busy ranks in rings of 2 and of 4 (a hang or a wrong peer in the sub-rings fails here); each link at
    least the idle link it is floored at, the compute share at least 1."""
    from dsgd_teach.collectives.cost_model import AlphaBeta
    from dsgd_teach.transformer.busy_link import measure_busy_links

    floor = AlphaBeta(1e-6, 1e-12)
    share, links = measure_busy_links(cluster4, 4, 2e-4, floor, repeats=3, sizes=(256, 4096))
    assert set(links) == {2, 4} and share >= 1.0
    assert all(link.alpha >= floor.alpha and link.beta >= floor.beta for link in links.values())


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_each_run_is_compared_with_the_single_process_model_and_keeps_no_parameters(runs, name):
    """run() compares every rank with the oracle as it ends, so the kernel keeps each rank's coordinates only (a
    chapter of runs at a few million parameters held every rank's copy before, hundreds of MiB)."""
    from dsgd_teach.transformer.experiment import oracle_gap

    result = runs[name]
    gap = oracle_gap(result)
    assert gap["ranks"] == result.config.layout.world and gap["steps"] == result.config.steps
    assert gap["loss"] < 1e-4 and gap["params"] < 1e-5, gap
    assert result.summary["max_param_diff_vs_oracle"] == gap["params"]
    assert all(set(rank) == {"coords"} for rank in result.extras.ranks)


def test_a_run_without_the_check_says_so_when_asked_for_its_gap():
    from dsgd_teach.trace import Result
    from dsgd_teach.transformer.experiment import TransformerExtras, oracle_gap

    config = TransformerConfig(check=False)
    unchecked = Result(config, None, {}, None, False, TransformerExtras(None, {}, None, [{"coords": {}}]))
    with pytest.raises(ValueError, match="check=True"):
        oracle_gap(unchecked)
    with pytest.raises(ValueError, match="check"):
        TransformerConfig(check="yes")


def test_the_remembered_oracle_tells_apart_everything_the_oracle_depends_on():
    """Layouts of one model and batch share the single-process run; any change to what it trains makes another."""
    from dataclasses import replace

    from dsgd_teach.transformer.model import GPTShape
    from dsgd_teach.transformer.oracle import cached_oracle

    tiny = GPTShape(vocab=16, seq_len=8, width=16, heads=2, layers=2, mlp_ratio=2)
    base = TransformerConfig(shape=tiny, batch=8, steps=2, corpus_tokens=500)
    losses, model = cached_oracle(base)
    for layout in (dict(tp=2), dict(pp=2), dict(cp=2), dict(dp=2, microbatches=2)):
        assert cached_oracle(base.replace(**layout))[1] is model, layout
    moe = base.replace(shape=replace(tiny, experts=4, top_k=2))
    changes = [base.replace(lr=0.2), base.replace(steps=3), base.replace(batch=4), base.replace(seed=1),
               base.replace(corpus_tokens=600), base.replace(shape=replace(tiny, width=32)), moe,
               moe.replace(aux_weight=0.5), moe.replace(dp=2, ep=2, microbatches=2)]
    seen = [losses]
    for changed in changes:
        other = cached_oracle(changed)[0]
        assert all(other != s for s in seen), changed
        seen.append(other)
    assert cached_oracle(base)[1] is not model  # two remembered: base's was let go meanwhile


def test_a_pipeline_rank_leaves_sympy_unimported():
    """backward given a gradient tensor imports sympy (34 MiB in each process that does it); the stages start
    their backward from a scalar instead, which is what keeps eight workers of the full chapter in Binder's 2 GiB."""
    import sys

    def imported() -> bool:
        return "sympy" in sys.modules

    with start_client(2, quiet=True, use_gpu=False) as client:
        assert not any(client.run(imported).values()), "a fresh worker already has sympy: the test shows nothing"
        result = run(TransformerConfig(pp=2, steps=2, predict=False, verbose=False), client)
        assert result.extras.oracle["params"] < 1e-5
        assert not any(client.run(imported).values())


def test_a_run_stopped_early_is_compared_with_the_oracle_at_the_step_it_stopped():
    """The ranks all stop after the same step (their vote), so the oracle trained as many steps is the reference."""
    from dsgd_teach.trace import StopRequested

    def stop_soon(event: dict) -> None:
        if event.get("event") == "update" and event.get("step", 0) >= 1:
            raise StopRequested

    with start_client(2, quiet=True, use_gpu=False) as client:
        result = run(TransformerConfig(tp=2, steps=100, predict=False, verbose=False), client, on_update=stop_soon)
    assert result.stopped and 2 <= result.summary["steps"] < 100
    gap = result.extras.oracle
    assert gap["steps"] == result.summary["steps"] and gap["ranks"] == 2
    assert gap["loss"] < 1e-4 and gap["params"] < 1e-5, gap
