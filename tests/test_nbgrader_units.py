"""Pieces of the nbgrader route that need no kernel: redaction, check statuses, batch log, loud failures."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from dsgd_teach.grading import batch as grading
from dsgd_teach.grading.batch import Limits
from dsgd_teach.grading.nbg.batches import (
    PROBE,
    GradingBatch,
    GradingEnvironmentError,
    log_path_for,
    read_batches,
)
from dsgd_teach.grading.nbg.preprocessors import DsgdGrade, RedactFeedback, _apply
from dsgd_teach.grading.nbg.redact import check_statuses, redact_source, verdict_lines, verdict_outputs
from dsgd_teach.grading.notebook import load_assignment
from dsgd_teach.grading.values import encode
from dsgd_teach.grading.verdict import Grade

PS05 = Path(__file__).resolve().parents[1] / "course" / "assignments" / "source" / "ps05_collectives" / \
    "ps05_collectives.ipynb"


def _rec(label: str, value, hidden: bool) -> dict:
    return {"label": label, "value": encode(value), "rtol": 1e-9, "atol": 0.0, "hidden": hidden, "hint": "",
            "solution_ok": True}


def test_redacted_test_cells_keep_visible_checks_and_lose_hidden_blocks_and_oracles():
    assignment = load_assignment(PS05)
    for q in assignment.questions:
        assert "BEGIN HIDDEN TESTS" in q.source and "_ref" in q.source
        text = redact_source(q.source)
        assert "HIDDEN TESTS" not in text and "_ref" not in text and "grader_seed" not in text
        assert text.splitlines()[0] == q.source.splitlines()[0] and "check(" in text


def test_each_hidden_check_is_listed_in_words_with_its_status():
    records = [_rec("visible", 1.0, False), _rec("h1", [1.5, 2.5], True), _rec("h2", 7.0, True),
               _rec("h3", [[1, 2]], True)]
    failed = Grade("q", 0.0, 3.0, "hidden check 'h2' failed: expected a whole number; your code gave None")
    assert [s for _, s in check_statuses(records, failed)] == ["passed", "passed", "failed", "not reached"]
    lines = verdict_lines(records, failed)
    assert lines[0].startswith("0 / 3 points: hidden check 'h2' failed")
    assert "h1: expects a float array of shape (2,), within rtol=1e-09, atol=0 -> passed" in lines[2]
    assert "h3: expects an integer-valued array of shape (1, 2)" in lines[4] and lines[4].endswith("not reached")
    assert not any(value in "\n".join(lines[1:]) for value in ("1.5", "2.5", "7.0"))
    assert [o["output_type"] for o in verdict_outputs(records, failed)] == ["error"]
    passed = Grade("q", 3.0, 3.0, "passed")
    assert [o["output_type"] for o in verdict_outputs(records, passed)] == ["stream"]


def test_nbgrader_scores_the_verdict_with_its_partial_credit():
    """nbgrader's own determine_grade reads the outputs: 0 for nothing, the points earned, all of them."""
    from nbgrader.utils import determine_grade

    records = [_rec("visible", 1.0, False), _rec("h1", 2.0, True), _rec("h2", 7.0, True)]
    cell = nbformat.v4.new_code_cell("check(...)")
    cell.metadata["nbgrader"] = {"grade": True, "solution": False, "grade_id": "q", "points": 3, "locked": True,
                                 "schema_version": 3, "task": False}
    for grade, earned in [(Grade("q", 0.0, 3.0, "hidden check 'h1' failed"), 0.0),
                          (Grade("q", 1.5, 3.0, "hidden check 'h2' failed"), 1.5),
                          (Grade("q", 3.0, 3.0, "passed"), 3.0)]:
        cell.outputs = verdict_outputs(records, grade)
        assert determine_grade(cell) == (earned, 3.0), grade


def test_apply_writes_one_verdict_per_test_cell_and_re_adds_deleted_ones():
    assignment = load_assignment(PS05)
    q1, q2 = (q.grade_id for q in assignment.questions)
    nb = nbformat.read(str(PS05), as_version=4)
    nb.cells = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") != q2]
    reference = {"tests": {q1: {"records": [_rec("a", 1, True)]}, q2: {"records": [_rec("b", 2, True)]}}}
    _apply(nb, assignment, reference, [Grade(q1, 3.0, 3.0, "passed"), Grade(q2, 0.0, 3.0, "no")])
    graded = {c.metadata["nbgrader"]["grade_id"]: c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")}
    assert set(graded) == {q1, q2}
    assert graded[q2].outputs[0]["output_type"] == "error" and graded[q2].metadata["nbgrader"]["points"] == 3.0
    assert all("HIDDEN" not in c.source and "_ref" not in c.source for c in graded.values())


def test_feedback_redaction_strips_stock_autograde_output_and_refuses_what_it_cannot_strip():
    nb = nbformat.read(str(PS05), as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = [nbformat.v4.new_output("error", ename="AssertionError", evalue="x",
                                                   traceback=["    _ref_s = [[(r, ...", "AssertionError: x"])]
    out, _ = RedactFeedback().preprocess(nb, {})
    assert "_ref" not in nbformat.writes(out) and "HIDDEN TESTS" not in nbformat.writes(out)
    out.metadata["leak"] = "_ref_sum = 1"
    with pytest.raises(GradingEnvironmentError):
        RedactFeedback().preprocess(out, {})


def test_batch_log_sits_beside_the_gradebook_and_groups_notebooks_by_batch(tmp_path):
    log = log_path_for(f"sqlite:///{tmp_path / 'gb' / 'gradebook.db'}", "/elsewhere")
    assert log == (tmp_path / "gb" / "dsgd_grading_batches.jsonl").resolve()
    first, second = (GradingBatch(seed, Limits(), log, []) for seed in (11, 22))
    first.record({"student": "a"})
    first.record({"student": "b"})
    second.record({"student": "a"})
    batches = read_batches(log)
    assert [b["seed"] for b in batches.values()] == [11, 22]
    assert [len(b["notebooks"]) for b in batches.values()] == [2, 1]


def test_a_kernel_that_never_starts_fails_the_batch_instead_of_scoring_zero(monkeypatch, tmp_path):
    assignment = load_assignment(PS05)
    started = {"tests": {q.grade_id: {"status": "ok", "records": [_rec("c", 1, False)]}
                         for q in assignment.questions}}
    dead = {"tests": {q.grade_id: {"status": "not run", "records": [], "error": "the grading kernel failed to "
                                   "start: RuntimeError"} for q in assignment.questions}}
    batch = GradingBatch(5, Limits(), tmp_path / "log.jsonl", [])
    monkeypatch.setattr(grading, "run_worker", lambda *a, **k: dead)
    with pytest.raises(GradingEnvironmentError, match="reference run: the grading kernel never ran a cell"):
        batch.reference(PS05, "ps05_collectives", "ps05_collectives")
    probe = {"tests": {PROBE: {"status": "not run", "records": [], "error": "the grading kernel failed to start"}}}

    def run_worker(cells, mode, *a, **k):
        return probe if cells[0].get("grade_id") == PROBE else started if mode == "reference" else dead

    monkeypatch.setattr(grading, "run_worker", run_worker)
    monkeypatch.setattr("dsgd_teach.grading.nbg.batches.check_reference", lambda *a: None)
    assignment, reference = batch.reference(PS05, "ps05_collectives", "ps05_collectives")
    pre = DsgdGrade()
    with pytest.raises(GradingEnvironmentError, match="failed to start.*a probe sandbox failed too"):
        pre._grade_student(batch, assignment, reference, nbformat.read(str(PS05), as_version=4), "alice")
    assert batch.failure and "alice" in batch.failure


def test_a_student_whose_own_run_dies_scores_zero_when_a_probe_sandbox_works(monkeypatch, tmp_path):
    """Only grader-side facts (the probe) decide that the environment failed, never the student's own run."""
    assignment = load_assignment(PS05)
    started = {"tests": {q.grade_id: {"status": "ok", "records": [_rec("c", 1, False)]}
                         for q in assignment.questions}}
    probe = {"tests": {PROBE: {"status": "ok", "records": [_rec("probe", 1, False)]}}}
    killed = {"error": "the grading process failed (exit 137): no output"}  # the student killed its own worker
    asked = []

    def run_worker(cells, mode, *a, **k):
        asked.append(cells[0].get("grade_id"))
        return probe if cells[0].get("grade_id") == PROBE else started if mode == "reference" else killed

    monkeypatch.setattr(grading, "run_worker", run_worker)
    monkeypatch.setattr("dsgd_teach.grading.nbg.batches.check_reference", lambda *a: None)
    batch = GradingBatch(5, Limits(), tmp_path / "log.jsonl", [])
    assignment, reference = batch.reference(PS05, "ps05_collectives", "ps05_collectives")
    grades = DsgdGrade()._grade_student(batch, assignment, reference, nbformat.read(str(PS05), as_version=4), "eve")
    assert batch.failure is None and PROBE in asked
    assert [g.points for g in grades] == [0.0] * len(assignment.questions), grades
    assert all(g.reason.startswith("the grading process failed (exit 137)") for g in grades), grades
    assert not any(g.question == "(integrity)" for g in grades), grades


def _metadata_chaos(nb) -> None:
    """Cells of the plain route's metadata chaos, a newer schema, a pasted copy and a de-duplicated copy."""
    q1 = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade", False))
    gid = q1.metadata["nbgrader"]["grade_id"]
    extra = [nbformat.v4.new_code_cell("x = 1") for _ in range(8)]
    extra[0].metadata["nbgrader"] = {**q1.metadata["nbgrader"], "grade_id": "extra", "schema_version": 4}
    extra[1].metadata["nbgrader"] = dict(q1.metadata["nbgrader"])  # the test cell pasted twice
    extra[2].metadata["nbgrader"] = {}  # what nbgrader's DeduplicateIds leaves of a copy
    extra[3].metadata["nbgrader"] = {**q1.metadata["nbgrader"], "grade_id": "not_in_the_source"}
    extra[4].metadata["nbgrader"] = {**q1.metadata["nbgrader"], "points": "3", "grade": 1}
    extra[5].metadata["nbgrader"] = {**q1.metadata["nbgrader"], "schema_version": True, "grade_id": gid + "x"}
    extra[6].metadata["nbgrader"] = {"dsgd_invalid": "the nbgrader metadata is a list, not an object"}
    extra[7].metadata["nbgrader"] = {**q1.metadata["nbgrader"], "cell_type": "code", "grade_id": "a b"}
    nb.cells += extra


def test_metadata_nbgrader_refuses_is_stripped_from_that_cell_only():
    """Every kind of bad nbgrader metadata leaves the notebook valid for nbgrader's own validator."""
    from nbgrader.nbgraderformat import MetadataValidator

    from dsgd_teach.grading.nbg.metadata import known_cells, strip_bad

    nb = nbformat.read(str(PS05), as_version=4)
    _metadata_chaos(nb)
    with pytest.raises(Exception):  # noqa: B017 - nbgrader's SchemaTooNewError, or another of its errors
        MetadataValidator().validate_nb(nb)
    graded_before = [c.metadata["nbgrader"]["grade_id"] for c in nb.cells[:-8] if "nbgrader" in c.metadata]
    problems = strip_bad(nb, known_cells(nbformat.read(str(PS05), as_version=4)))
    MetadataValidator().validate_nb(nb)
    assert [c.metadata["nbgrader"]["grade_id"] for c in nb.cells if "nbgrader" in c.metadata] == graded_before
    assert len(problems) == 8, problems
    for word in ("schema version 4", "second copy", "schema version 0", "unknown grade id", "'grade' is a int",
                 "schema version True", "metadata is a list", "grade id 'a b'"):
        assert any(word in p for p in problems), (word, problems)
