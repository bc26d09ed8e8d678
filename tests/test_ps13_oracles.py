"""ps13's hidden oracles equal chapter 10's code: full attention and the package's block attention and merge, the
mesh numbering and `Layout.groups` (itself held to torch's init_device_mesh in test_transformer_mesh), the routing
of `experts.route`, and predict.py's bytes per axis without the weights' gradient allreduces.

The oracles live in the notebook (a grading kernel cannot import dsgd_teach.transformer: its package imports
dask.distributed, which the grading fence stops), so this test is what ties them to the package.
"""

from __future__ import annotations

import ast
import itertools
import math

import numpy as np
import pytest
import torch
from mutants import harness

from dsgd_teach.grading.notebook import nbgrader_meta
from dsgd_teach.transformer import experts, ring_attention
from dsgd_teach.transformer.mesh import MESH_ORDER, Layout
from dsgd_teach.transformer.model import GPTShape
from dsgd_teach.transformer.predict import Plan, axis_bytes, replicated_params, ring_allreduce, stage_params

NAME = "ps13_transformer"


@pytest.fixture(scope="module")
def oracles() -> dict:
    """The setup cell, then every `_ref*` definition and the constants of the test cells, in one namespace."""
    a = harness.assignment(NAME)
    ns: dict = {}
    for cell in a.notebook.cells:
        gid = str(nbgrader_meta(cell).get("grade_id", ""))
        if gid == f"{NAME}_setup":
            exec(cell.source, ns)  # noqa: S102 - the course's own notebook
        elif gid.endswith("_tests"):
            for node in ast.parse(cell.source).body:
                named = [t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)]
                if (isinstance(node, ast.FunctionDef) and node.name.startswith("_ref")) or named == ["AXES"]:
                    exec(compile(ast.Module([node], []), NAME, "exec"), ns)  # noqa: S102
    return ns


def _unreport(pair: list) -> tuple[np.ndarray, np.ndarray]:
    o, ell = pair
    return np.asarray(o, dtype=float), np.array([float(x) for x in ell])


def test_attention_oracle_is_the_package_s_blocks_and_merge(oracles) -> None:
    rng = np.random.default_rng(0)
    for _ in range(20):
        n, d, dv = int(rng.integers(2, 9)), int(rng.integers(1, 7)), int(rng.integers(1, 5))
        q, k, v = rng.standard_normal((n, d)) * 3, rng.standard_normal((n, d)), rng.standard_normal((n, dv))
        tq, tk, tv = (torch.as_tensor(x) for x in (q, k, v))
        for diagonal in (False, True):
            mask = np.tril(np.ones((n, n), bool)) if diagonal else None
            o, ell = _unreport(oracles["_ref_full"](q, k, v, mask))
            po, pl = ring_attention.block_attention(tq, tk, tv, diagonal)
            np.testing.assert_allclose(o, po.numpy(), rtol=1e-12, atol=1e-14)
            np.testing.assert_allclose(ell, pl.numpy(), rtol=1e-12)
        cut = int(rng.integers(1, n))  # two blocks of keys merged by the package equal the oracle on all of them
        halves = [ring_attention.block_attention(tq, tk[a:b], tv[a:b], False) for a, b in ((0, cut), (cut, n))]
        mo, ml = ring_attention.merge(*halves[0], *halves[1])
        o, ell = _unreport(oracles["_ref_full"](q, k, v))
        np.testing.assert_allclose(o, mo.numpy(), rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(ell, ml.numpy(), rtol=1e-12)
    o, ell = _unreport(oracles["_ref_full"](q, k, v, np.zeros((n, n), bool)))
    assert (o == 0).all() and (ell == -math.inf).all()  # no key seen: o = 0, ell = -inf


def test_mesh_oracle_is_layout_s_numbering_and_groups(oracles) -> None:
    assert tuple(oracles["AXES"]) == MESH_ORDER
    layouts = [dict(zip(MESH_ORDER, s, strict=True)) for s in itertools.product(range(1, 9), repeat=4)
               if math.prod(s) <= 8]
    for sizes in layouts:
        layout = Layout(**sizes)
        assert oracles["_ref_ranks"](sizes) == [layout.rank_of(**dict(zip(MESH_ORDER, c, strict=True)))
                                                for c in np.ndindex(*(sizes[a] for a in MESH_ORDER))]
        for axis in MESH_ORDER:
            assert oracles["_ref_groups"](sizes, axis) == [list(g) for g in layout.groups(axis)], (sizes, axis)


def test_routing_oracle_is_experts_route(oracles) -> None:
    rng = np.random.default_rng(1)
    for _ in range(60):
        b, s, e = int(rng.integers(1, 5)), int(rng.integers(1, 9)), int(rng.integers(1, 7))
        k, c = int(rng.integers(1, e + 1)), float(rng.choice([0.25, 0.5, 1.0, 1.25, 1.5, 2.0]))
        logits = rng.standard_normal((b, s, e)) * 1.5 + rng.standard_normal(e) * 1.5
        got = oracles["_ref_route"](logits, k, c)
        r = experts.route(torch.as_tensor(logits).reshape(-1, e), k, c)
        stats = r.stats(e)
        assert got["capacity"] == r.capacity == stats["capacity"]
        np.testing.assert_array_equal(got["expert"], r.expert.numpy())
        np.testing.assert_array_equal(got["keep"], r.keep.numpy())
        np.testing.assert_allclose(got["gate"], r.gate.numpy(), rtol=1e-6)  # the package routes in float32
        assert [got[key] for key in ("tokens_per_expert", "kept_per_expert", "dropped_tokens")] == \
            [stats[key] for key in ("tokens_per_expert", "kept_per_expert", "dropped_tokens")]


def test_bytes_oracle_is_predict_s_axis_bytes_without_the_gradient_allreduces(oracles) -> None:
    rng = np.random.default_rng(2)
    for _ in range(60):
        tp, pp, cp = (int(x) for x in rng.choice([1, 2, 4], 3))
        heads, m, b = tp * int(rng.integers(1, 3)), int(rng.integers(1, 5)), int(rng.integers(1, 4))
        shape = GPTShape(vocab=16, seq_len=2 * cp * tp * int(rng.integers(1, 4)), width=heads * 2, heads=heads,
                         layers=pp * int(rng.integers(1, 3)))
        plan = Plan(tp=tp, pp=pp, cp=cp, batch=b * m, microbatches=m, itemsize=int(rng.choice([2, 4])),
                    sequence_parallel=bool(rng.integers(0, 2)))
        stage = int(rng.integers(0, pp))
        want = axis_bytes(shape, plan, stage)
        if plan.sequence_parallel:  # the allreduce of the weights every tensor rank holds whole
            want["tp"] -= ring_allreduce(tp, replicated_params(shape, plan, stage))[1] * plan.itemsize
        if cp > 1:  # the allreduce of the weights' gradients over the context ranks
            want["cp"] -= ring_allreduce(cp, stage_params(shape, plan, stage))[1] * plan.itemsize
        got = oracles["_ref_bytes"](b, shape.seq_len, shape.width, shape.layers, m, tp, pp, cp, stage, plan.itemsize,
                                    plan.sequence_parallel)
        assert got == pytest.approx({axis: want[axis] for axis in ("tp", "pp", "cp")}, rel=1e-12, abs=1e-6), (shape, plan)
