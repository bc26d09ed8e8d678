"""Partial credit pays only for evidence of computing: guards (invariant checks, values any stub gives) count only
beside a passing value check, and a stub that knows the visible answers earns nothing on any question."""

from __future__ import annotations

import nbformat
import pytest
from mutants import harness, stubs
from mutants.catalog import CATALOG

from dsgd_teach.grading.notebook import Assignment, Question
from dsgd_teach.grading.values import encode
from dsgd_teach.grading.verdict import check_guards, check_outcomes, grade

LABELS = ["visible", "value, case #0", "leaves case #0 alone", "value, case #1", "leaves case #1 alone"]
STUB_SEEDS = range(12)


def _assignment(guards: list[str] | None) -> Assignment:
    nb = nbformat.v4.new_notebook(metadata={"dsgd_teach": {"partial_credit": True}})
    cell = nbformat.v4.new_code_cell("check('x', 1, 1)")
    cell.metadata["nbgrader"] = {"grade": True, "grade_id": "q1_tests", "points": 4, "solution": False}
    if guards is not None:
        cell.metadata["dsgd_teach"] = {"guards": guards}
    nb.cells.append(cell)
    return Assignment("toy", nb, (Question("q1_tests", 4.0, cell.source),))


def _reports(values: list[float]) -> tuple[dict, dict]:
    ref = [{"label": lab, "value": encode(1.0), "rtol": 0.0, "atol": 0.0, "hidden": k > 0, "hint": "",
            "solution_ok": True} for k, lab in enumerate(LABELS)]
    got = [{"label": lab, "value": encode(v)} for lab, v in zip(LABELS, values, strict=True)]
    return ({"tests": {"q1_tests": {"status": "ok", "error": "", "records": ref}}},
            {"tests": {"q1_tests": {"status": "ok", "error": "", "records": got}}})


@pytest.mark.parametrize(("values", "credited"), [
    ([1, 0, 1, 0, 1], 0),  # every invariant holds, no value right: nothing
    ([1, 1, 1, 0, 1], 2),  # case 0 right: its value and its guard count
    ([1, 1, 0, 1, 1], 3),  # case 0's guard fails: both values and case 1's guard count
    ([1, 0, 1, 1, 1], 2),  # case 0's guard does not count on its own
])
def test_a_guard_counts_only_beside_the_value_check_before_it(values, credited):
    [g] = grade(_assignment(["leaves case"]), *_reports(values))
    assert g.points == credited, g
    if credited:
        assert f"{credited} of 4 hidden checks passed" in g.reason


def test_without_guards_every_passing_check_counts():
    [g] = grade(_assignment(None), *_reports([1, 0, 1, 0, 1]))
    assert g.points == 2.0


@pytest.mark.parametrize("bad", [["leaves", 3], "leaves", {"leaves": 1}])
def test_malformed_guards_are_ignored_or_kept_to_strings(bad):
    assert check_guards(_assignment(bad), "q1_tests") == (["leaves"] if isinstance(bad, list) else [])


def _stub_points(name: str, family: str) -> dict[str, list[float]]:
    """Per question: the stub's points at every seed; asserts it passes every visible check (the gate is open)."""
    a = harness.assignment(name)
    out: dict[str, list[float]] = {q.grade_id: [] for q in a.questions}
    for seed in STUB_SEEDS:
        ref, report = harness.reference(a, seed), stubs.run_stub(a, family, seed)
        for q, g in zip(a.questions, grade(a, ref, report), strict=False):
            expected = ref["tests"][q.grade_id]["records"]
            outcomes = check_outcomes(expected, report["tests"].get(q.grade_id))
            assert outcomes is not None, (q.grade_id, seed)
            shut = [e["label"] for e, o in zip(expected, outcomes, strict=True) if not e["hidden"] and o != "passed"]
            assert not shut, f"{q.grade_id} seed {seed}: the stub fails visible checks {shut}, so it proves nothing"
            out[q.grade_id].append(g.points)
    return out


@pytest.mark.timeout(240)
@pytest.mark.parametrize("family", sorted(stubs.FAMILIES))
@pytest.mark.parametrize("name", sorted(CATALOG))
def test_a_stub_that_knows_the_visible_answers_scores_nothing(name, family):
    """It looks up the visible tests' inputs and returns zeros, empty values or None otherwise."""
    points = _stub_points(name, family)
    scored = {q: [(seed, p) for seed, p in zip(STUB_SEEDS, ps, strict=True) if p] for q, ps in points.items()}
    assert not any(scored.values()), {q: s[:4] for q, s in scored.items() if s}
