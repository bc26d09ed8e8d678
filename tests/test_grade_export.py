"""Partial credit per hidden check, and the Gradescope / Canvas exports, checked against their documented formats."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field

import nbformat
import pytest
from mutants import harness
from mutants.catalog import CATALOG

from dsgd_teach.grading import cli, export
from dsgd_teach.grading.feedback import write_feedback
from dsgd_teach.grading.notebook import Assignment, Question
from dsgd_teach.grading.values import encode
from dsgd_teach.grading.verdict import Grade, grade

# --- partial credit -------------------------------------------------------------------------------------------------

LABELS = [("visible a", False), ("visible b", False), ("hidden small 1", True), ("hidden small 2", True),
          ("hidden big", True)]


def _assignment(partial: bool, weights: dict | None = None) -> Assignment:
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("check('x', 1, 1)")
    cell.metadata["nbgrader"] = {"grade": True, "grade_id": "q1_tests", "points": 4, "solution": False}
    if weights:
        cell.metadata["dsgd_teach"] = {"weights": weights}
    nb.cells.append(cell)
    if partial:
        nb.metadata["dsgd_teach"] = {"partial_credit": True}
    return Assignment("toy", nb, (Question("q1_tests", 4.0, cell.source),))


def _reference() -> dict:
    return {"tests": {"q1_tests": {"status": "ok", "error": "", "records": [
        {"label": label, "value": encode(1.0), "rtol": 0.0, "atol": 0.0, "hidden": hidden, "hint": "",
         "solution_ok": True} for label, hidden in LABELS]}}}


def _student(values: list[float], *, status: str = "ok", labels: list[str] | None = None) -> dict:
    labels = labels or [label for label, _ in LABELS]
    records = [{"label": lab, "value": encode(v)} for lab, v in zip(labels, values, strict=False)]
    return {"tests": {"q1_tests": {"status": status, "records": records,
                                   "error": "" if status == "ok" else "ValueError: boom"}}}


def test_points_per_hidden_check_with_weights():
    a = _assignment(True, {"hidden big": 2})
    [g] = grade(a, _reference(), _student([1, 1, 1, 0, 0]))  # one small (weight 1) of 1 + 1 + 2 passes
    assert g.points == 1.0 and g.max_points == 4.0
    assert "1 of 3 hidden checks passed" in g.reason
    assert g.reason.startswith("hidden check 'hidden small 2' failed") and "'hidden big' (failed)" in g.reason
    [g] = grade(a, _reference(), _student([1, 1, 0, 0, 1]))  # the weight-2 check alone: half the points
    assert g.points == 2.0
    [g] = grade(a, _reference(), _student([1, 1, 1, 1, 1]))
    assert (g.points, g.reason) == (4.0, "passed")


def test_hidden_checks_not_reached_after_an_error_earn_nothing_but_earlier_ones_count():
    [g] = grade(_assignment(True), _reference(), _student([1, 1, 1], status="error"))
    assert g.points == round(4 / 3, 2)
    assert "hidden check 'hidden small 2' never reported a value" in g.reason and "'hidden big' (not reached)" in g.reason


@pytest.mark.parametrize("case", ["visible fails", "extra report", "wrong label", "all-or-nothing assignment"])
def test_no_partial_credit_when_the_gate_or_the_reports_fail(case):
    a, student = _assignment(case != "all-or-nothing assignment"), _student([1, 1, 1, 1, 0])
    if case == "visible fails":
        student = _student([1, 0, 1, 1, 1])
    elif case == "extra report":
        student = _student([1, 1, 1, 1, 0, 1], labels=[lab for lab, _ in LABELS] + ["forged"])
    elif case == "wrong label":
        student = _student([1, 1, 1, 1, 0], labels=["visible a", "visible b", "hidden small 2", "hidden small 1",
                                                    "hidden big"])
    [g] = grade(a, _reference(), student)
    assert g.points == 0.0 and g.reason != "passed", g


def test_shipped_assignments_give_partial_credit_to_a_solution_wrong_on_hidden_inputs_only(tmp_path):
    """ps02's q1: a solution returning the wrong count passes the visible checks and half of the hidden ones."""
    a = harness.assignment("ps02_hogwild")
    variant = next(v for v in CATALOG["ps02_hogwild"] if v.name.startswith("returns the nonzeros"))
    grades = harness.grade_variant(a, harness.reference(a, 3), variant, 3)
    q1 = next(g for g in grades if g.question == "ps02_hogwild_q1_tests")
    assert q1.points == 1.0 and q1.max_points == 2.0, q1
    assert "4 of 8 hidden checks passed" in q1.reason and "coordinates written, random update #0" in q1.reason
    write_feedback(tmp_path / "page.html", "s", "ps02_hogwild", grades)
    page = (tmp_path / "page.html").read_text()
    assert "1 / 2" in page and "4 of 8 hidden checks passed" in page


# --- exports --------------------------------------------------------------------------------------------------------

@dataclass
class Sub:
    student: str
    assignment: str
    grades: list[Grade] = field(default_factory=list)


SUBS = [
    Sub("alice", "ps01_sgd", [Grade("ps01_sgd_q1_tests", 2.0, 2.0, "passed"),
                              Grade("ps01_sgd_q2_tests", 1.5, 2.0, "1.5 of 2 points: 3 of 4 hidden checks passed")]),
    Sub("bob", "ps01_sgd", [Grade("ps01_sgd_q1_tests", 0.0, 2.0, "the test cell was not run"),
                            Grade("ps01_sgd_q2_tests", 0.0, 2.0, "no notebook submitted"),
                            Grade("(integrity)", 0.0, 0.0, "FLAGGED: the sandbox denied open")]),
    Sub("alice", "ps02_hogwild", [Grade("ps02_hogwild_q1_tests", 2.0, 2.0, "passed")]),
    Sub("=cmd()", "ps02_hogwild", [Grade("ps02_hogwild_q1_tests", 1.0, 2.0, "x")]),
    Sub("carol", "(skipped)", [Grade("(skipped)", 0.0, 0.0, "skipped (not a regular file or folder): c is a FIFO")]),
]

# Gradescope's autograder output format (https://gradescope-autograders.readthedocs.io/en/latest/specs/).
GS_TOP = {"score", "execution_time", "output", "output_format", "test_output_format", "test_name_format",
          "visibility", "stdout_visibility", "extra_data", "tests", "leaderboard"}
GS_TEST = {"score", "max_score", "status", "name", "name_format", "number", "output", "output_format", "tags",
           "visibility", "extra_data"}
GS_VISIBILITY = {"hidden", "after_due_date", "after_published", "visible"}


def validate_gradescope(doc: dict) -> None:
    """Raise AssertionError unless doc is a results.json Gradescope accepts."""
    assert isinstance(doc, dict) and set(doc) <= GS_TOP, set(doc) - GS_TOP
    tests = doc.get("tests", [])
    assert isinstance(tests, list)
    assert "score" in doc or all("score" in t for t in tests), "score is required at the top or on every test"
    if "score" in doc:
        assert isinstance(doc["score"], (int, float)) and not isinstance(doc["score"], bool)
    for key in ("visibility", "stdout_visibility"):
        assert doc.get(key, "visible") in GS_VISIBILITY, doc.get(key)
    assert isinstance(doc.get("output", ""), str) and isinstance(doc.get("extra_data", {}), dict)
    for t in tests:
        assert isinstance(t, dict) and set(t) <= GS_TEST, set(t) - GS_TEST
        for key in ("score", "max_score"):
            if key in t:
                assert isinstance(t[key], (int, float)) and not isinstance(t[key], bool), (key, t)
        assert t.get("status", "passed") in ("passed", "failed"), t
        assert t.get("visibility", "visible") in GS_VISIBILITY, t
        assert all(isinstance(t.get(k, ""), str) for k in ("name", "number", "output")), t
        if "score" in t and "max_score" in t:
            assert 0 <= t["score"] <= t["max_score"], t
    if "score" in doc and tests and all("score" in t for t in tests):
        assert doc["score"] == pytest.approx(sum(t["score"] for t in tests))


def validate_canvas(text: str) -> list[dict]:
    """Raise AssertionError unless text is a gradebook CSV Canvas imports; returns the student rows."""
    rows = list(csv.reader(io.StringIO(text)))
    header = rows[0]
    assert header[:5] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"], header
    assert len(set(header)) == len(header) and all(h.strip() for h in header[5:]), header
    assert rows[1][0].strip() == "Points Possible", rows[1]
    possible = [float(v) for v in rows[1][5:]]
    out = []
    for row in rows[2:]:
        assert len(row) == len(header), row
        assert row[0] or row[1] or row[2] or row[3], f"a row Canvas cannot match to a student: {row}"
        for value, best in zip(row[5:], possible, strict=True):
            assert value == "" or 0 <= float(value) <= best, (row, value, best)
        out.append(dict(zip(header, row, strict=True)))
    return out


def test_gradescope_results_follow_the_specification():
    for sub in SUBS[:4]:
        doc = export.gradescope_results(sub)
        validate_gradescope(json.loads(json.dumps(doc)))
    alice = export.gradescope_results(SUBS[0])
    assert alice["score"] == 3.5 and [t["status"] for t in alice["tests"]] == ["passed", "failed"]
    assert alice["tests"][1]["score"] == 1.5 and alice["tests"][1]["max_score"] == 2.0
    assert "3 of 4 hidden checks passed" in alice["tests"][1]["output"]
    bob = export.gradescope_results(SUBS[1])
    assert len(bob["tests"]) == 2 and bob["extra_data"]["flags"] == ["FLAGGED: the sandbox denied open"]
    with pytest.raises(ValueError):
        export.gradescope_results(SUBS[0], visibility="sometimes")


def test_a_broken_document_fails_the_gradescope_validator():
    doc = export.gradescope_results(SUBS[0])
    for broken in ({**doc, "tests": [{**doc["tests"][0], "status": "ok"}]}, {**doc, "visibility": "public"},
                   {**doc, "score": "3.5"}, {**doc, "grade": 1}):
        with pytest.raises(AssertionError):
            validate_gradescope(broken)


def test_canvas_csv_follows_the_gradebook_import_format():
    rows = validate_canvas(export.canvas_csv(SUBS))
    by_student = {r["SIS User ID"]: r for r in rows}
    assert set(by_student) == {"alice", "bob", "'=cmd()", "carol"}
    assert by_student["alice"]["ps01_sgd"] == "3.5" and by_student["alice"]["ps02_hogwild"] == "2"
    assert by_student["bob"]["ps01_sgd"] == "0" and by_student["bob"]["ps02_hogwild"] == ""
    assert by_student["carol"]["ps01_sgd"] == ""
    assert export.canvas_csv(SUBS).splitlines()[1].startswith("Points Possible,,,,,4,2")


def test_cli_export_writes_both_formats(tmp_path, monkeypatch):
    monkeypatch.setattr(cli, "grade_batch", lambda *args, **kwargs: SUBS)
    (tmp_path / "subs").mkdir()
    out = tmp_path / "graded"
    rc = cli.main([str(tmp_path / "subs"), "--out", str(out), "--source", str(harness.default_source_dir()),
                   "--export", "gradescope", "--export", "canvas", "--no-progress"])
    assert rc == 0
    validate_canvas((out / "canvas_grades.csv").read_text())
    found = sorted(p.relative_to(out).as_posix() for p in (out / "gradescope").rglob("results.json"))
    assert found == ["gradescope/ps01_sgd/alice/results.json", "gradescope/ps01_sgd/bob/results.json",
                     "gradescope/ps02_hogwild/=cmd()/results.json", "gradescope/ps02_hogwild/alice/results.json"]
    for path in found:
        validate_gradescope(json.loads((out / path).read_text()))


def test_cli_refuses_an_unknown_export_format(tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli.main([str(tmp_path), "--export", "moodle"])
    assert "invalid choice" in capsys.readouterr().err


def test_export_refuses_a_symlink_where_a_file_goes(tmp_path):
    out = tmp_path / "graded"
    out.mkdir()
    (out / "canvas_grades.csv").symlink_to(tmp_path / "elsewhere.csv")
    with pytest.raises(Exception, match="canvas_grades.csv"):
        export.export(out, SUBS, ["canvas"])
    assert not (tmp_path / "elsewhere.csv").exists()


