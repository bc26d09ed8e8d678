"""The device mesh (transformer/mesh.py) and training on it (transformer/composed.py).

Oracles: each axis's groups are those torch's own `init_device_mesh` makes for the same shape; every layout trains
to the single-process GPT's loss and parameters within fp32 rounding; the bytes traced on each axis are the
chapter's formulas (transformer/predict.py) exactly; a layout that cannot be built raises a ValueError naming
the axis.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pandas as pd
import pytest
import torch.distributed as dist

from dsgd_teach.runtime.clusters.cluster import start_client
from dsgd_teach.trace import Result
from dsgd_teach.transformer.composed import ComposedConfig, run_composed
from dsgd_teach.transformer.expert_parallel import expert_parallel_bytes
from dsgd_teach.transformer.mesh import AXES, Layout
from dsgd_teach.transformer.mesh_plot import plot_mesh
from dsgd_teach.transformer.model import GPTShape
from dsgd_teach.transformer.oracle import compare_with_oracle
from dsgd_teach.transformer.predict import Plan, axis_bytes
from dsgd_teach.transformer.traffic import axis_table

#: fp32 rounding over a few steps of a tiny model (the runs differ from the oracle by about 1e-7).
TOL = 2e-5

#: A tiny mixture of experts: four experts, each token to its top two.
MOE_SHAPE = GPTShape(vocab=32, seq_len=16, width=32, heads=4, layers=2, mlp_ratio=2, experts=4, top_k=2)

LAYOUTS = {
    "dp2-pp2-cp2": dict(dp=2, pp=2, cp=2),  # 3 axes: data × pipeline × context (ring attention, balanced)
    "tp2-pp2-cp2-sp": dict(tp=2, pp=2, cp=2, sequence_parallel=True),  # 3 axes, tensor with sequence parallelism
    "dp2-tp2-pp2-ep2": dict(dp=2, tp=2, pp=2, ep=2, shape=MOE_SHAPE),  # 4 axes: experts on the data ranks
}


def device_mesh_groups(layout: Layout, rank: int) -> dict[str, tuple[int, ...]]:
    """The ranks of each axis's group holding `rank`, as torch's init_device_mesh forms them (a fake backend: one
    process plays each rank; no messages are sent)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    # The course's order, outermost first: pipeline, data (split into edp × ep with experts), context, tensor.
    data = [("edp", layout.dp // layout.ep), ("ep", layout.ep)] if layout.ep > 1 else [("dp", layout.dp)]
    dims = [("pp", layout.pp), *data, ("cp", layout.cp), ("tp", layout.tp)]
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=layout.world)
    try:
        names = tuple(name for name, _ in dims)
        mesh = init_device_mesh("cpu", tuple(size for _, size in dims), mesh_dim_names=names)
        out = {name: tuple(dist.get_process_group_ranks(mesh.get_group(name))) for name in names}
        if layout.ep > 1:  # the data axis is (edp, ep) flattened
            out["dp"] = tuple(dist.get_process_group_ranks(mesh["edp", "ep"]._flatten("dp").get_group()))
        return out
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("sizes", [dict(dp=2, tp=2, pp=2), dict(tp=2, pp=2, cp=2), dict(dp=2, tp=2, pp=2, ep=2),
                                   dict(dp=4, tp=2, ep=2), dict(dp=8, ep=4), dict(pp=2, dp=2, cp=2),
                                   dict(tp=8), dict(dp=3, tp=2)])
def test_each_axis_groups_are_device_mesh_s(sizes: dict[str, int]) -> None:
    layout = Layout(**sizes)
    groups_against_device_mesh(layout)
    # tensor parallelism is innermost: its groups are runs of neighbouring ranks
    assert all(g == tuple(range(g[0], g[0] + layout.tp)) for g in layout.groups("tp"))


def groups_against_device_mesh(layout: Layout) -> None:
    """AssertionError unless every rank's group on every axis is the one init_device_mesh forms."""
    for rank in range(layout.world):
        want = device_mesh_groups(layout, rank)
        got = {axis: layout.group_of(axis, rank) for axis in want}
        assert got == want, f"rank {rank} of {layout}"


@pytest.mark.parametrize("sizes, axis", [
    (dict(dp=3, tp=3), "dp·tp·pp·cp"),  # 9 ranks
    (dict(dp=0), "dp"),
    (dict(tp=9), "tp"),
    (dict(dp=2, ep=4), "ep must divide dp"),
    (dict(dp=2, cp=2, ep=2), "cp or ep"),
])
def test_a_layout_that_cannot_be_built_names_its_axis(sizes: dict[str, int], axis: str) -> None:
    with pytest.raises(ValueError, match=axis):
        Layout(**sizes)


@pytest.mark.parametrize("kw, axis", [
    (dict(tp=3), "tp=3 must divide the heads"),
    (dict(pp=4), "pp=4 stages need at least as many layers"),
    (dict(cp=4, shape=GPTShape(vocab=32, seq_len=12, width=32, heads=4, layers=2)), "cp=4"),
    (dict(dp=2, ep=2), "ep=2 must divide the experts"),
    (dict(dp=2, microbatches=3), "batch must be a multiple of dp·microbatches"),
    (dict(tp=2, sequence_parallel=True, shape=MOE_SHAPE), "sequence_parallel needs a dense MLP"),
    (dict(device="tpu"), "device"),
])
def test_a_model_that_does_not_fit_its_layout_names_the_axis(kw: dict[str, object], axis: str) -> None:
    with pytest.raises(ValueError, match=axis):
        ComposedConfig(**kw)


def test_the_mesh_picture_draws_each_axis_with_its_collective() -> None:
    fig = plot_mesh(Layout(dp=2, tp=2, pp=2, ep=2))
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert [label.split(" ")[0] for label in labels] == ["dp", "tp", "pp", "ep"]
    assert "all-to-all" in labels[3] and "send/recv" in labels[2]


@pytest.fixture(scope="module")
def cluster8():
    """An eight-worker cluster for this module, grown from two as the chapters' panels do (starting eight at once
    took five times as long)."""
    with start_client(2, quiet=True, use_gpu=False) as client:
        client.resize(8)
        yield client


_RUNS: dict[str, tuple[ComposedConfig, Result]] = {}


@pytest.fixture
def run_of(cluster8):
    """name -> (config, result): each layout trained once, on first use, for every test that reads it."""

    def get(name: str) -> tuple[ComposedConfig, Result]:
        if name not in _RUNS:
            config = ComposedConfig(**LAYOUTS[name], steps=3)
            _RUNS[name] = (config, run_composed(config, cluster8))
        return _RUNS[name]

    return get


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_each_layout_trains_to_the_single_process_oracle(run_of, name: str) -> None:
    config, result = run_of(name)
    assert len(config.layout.active) >= 3
    diff = compare_with_oracle(result, config)
    assert diff["steps"] == config.steps
    assert diff["loss"] < TOL and diff["params"] < TOL, diff


def expected_bytes(config: ComposedConfig, rank: int, trace: pd.DataFrame, step: int) -> dict[str, int]:
    """What each axis should carry for one rank and step: the chapter's formulas (predict.axis_bytes at the rank's
    coordinates, which makes each ring's uneven chunks exact), except on the expert axis, whose all-to-alls carry
    the rows this rank's routing actually sent (expert_parallel_bytes: the formula's uniform routing is a
    prediction; where the tokens went is the data's)."""
    shape, coords = config.shape, config.layout.coords(rank)
    plan = Plan(dp=config.dp, tp=config.tp, pp=config.pp, cp=config.cp, ep=config.ep, batch=config.batch,
                microbatches=config.microbatches, sequence_parallel=config.sequence_parallel,
                balanced=config.balanced, optimizer="sgd")
    want = axis_bytes(shape, plan, coords["pp"], coords)
    out = {axis: int(want[axis]) for axis in AXES}
    out["dp"] += int(want.get("edp", 0))  # the experts' gradients travel on the data axis's edp groups
    if shape.experts:
        routing = trace[(trace.event == "routing") & (trace.worker == rank) & (trace.step == step)]
        assert len(routing) == shape.layers // config.pp * config.microbatches  # one per MoE layer and microbatch
        out["ep"] = sum(expert_parallel_bytes(list(r.rows_sent), list(r.rows_received), coords["ep"], shape.width,
                                              4, shape.experts) for r in routing.itertuples())
    return out


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_traced_bytes_per_axis_equal_the_formulas(run_of, name: str) -> None:
    config, result = run_of(name)
    table = axis_table(result.trace)
    assert len(table) == config.layout.world * config.steps
    for (rank, step), row in table.iterrows():
        want = expected_bytes(config, rank, result.trace, step)
        assert row.to_dict() == want, f"rank {rank} at {config.layout.coords(rank)}, step {step}"
    ups = result.trace[result.trace.event == "update"]
    for axis in AXES:  # each step's event carries the same totals
        assert ups.set_index(["worker", "step"])[f"bytes_{axis}"].sort_index().tolist() == table[axis].tolist()


# --- negative controls: break one thing and the oracle comparison must fail (in this process, no cluster) --------


def test_the_groups_oracle_catches_two_axes_swapped(monkeypatch) -> None:
    """With the context and tensor axes swapped in the rank numbering, the groups are no longer torch's."""
    from dsgd_teach.transformer import mesh

    monkeypatch.setattr(mesh, "MESH_ORDER", ("pp", "dp", "tp", "cp"))
    with pytest.raises(AssertionError, match="rank 0"):
        groups_against_device_mesh(Layout(tp=2, pp=2, cp=2))


def oracle_as_result(config: ComposedConfig, trained: ComposedConfig, swap: tuple[int, int] | None = None) -> Result:
    """A Result as run_composed returns it, whose ranks hold the slices of the oracle trained under `trained`
    (with `swap`, two ranks' coordinates exchanged: each reports the other's slice)."""
    from dsgd_teach.transformer.mesh_parts import build_part, detached_mesh
    from dsgd_teach.transformer.oracle import oracle_run

    losses, model = oracle_run(trained)
    layout = config.layout
    coords = [layout.coords(r) for r in range(layout.world)]
    if swap:
        coords[swap[0]], coords[swap[1]] = coords[swap[1]], coords[swap[0]]
    extras = [{"coords": coords[r], "params": [p.detach().numpy().copy() for p in build_part(
        model, config, detached_mesh(layout, layout.coords(r))).parameters()]} for r in range(layout.world)]
    trace = pd.DataFrame({"event": "update", "step": range(len(losses)), "loss": losses})
    return Result(config, trace, {}, None, False, extras)


def test_the_training_oracle_catches_a_dropped_aux_loss_and_swapped_ranks() -> None:
    """compare_with_oracle on the oracle's own slices: nothing differs; trained without the load-balancing loss, the
    parameters differ beyond TOL; with two tensor ranks' slices exchanged, too."""
    moe = ComposedConfig(dp=2, ep=2, shape=MOE_SHAPE, steps=3)
    same = compare_with_oracle(oracle_as_result(moe, moe), moe)
    assert same["loss"] == 0.0 and same["params"] == 0.0
    dropped = compare_with_oracle(oracle_as_result(moe, moe.replace(aux_weight=0.0)), moe)
    assert dropped["params"] > TOL, dropped
    dense = ComposedConfig(tp=2, steps=1)
    swapped = compare_with_oracle(oracle_as_result(dense, dense, swap=(0, 1)), dense)
    assert swapped["loss"] == 0.0 and swapped["params"] > TOL, swapped
