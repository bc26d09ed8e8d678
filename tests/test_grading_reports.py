"""Hostile check reports: one submission's unreadable, oversized or leaking reports fail that submission only."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from dsgd_teach.grading import batch, reports
from dsgd_teach.grading.batch import Limits, Submission, _csv_text, grade_one
from dsgd_teach.grading.feedback import write_feedback
from dsgd_teach.grading.notebook import load_assignment
from dsgd_teach.grading.text import REDACTED, Redactor, clean, hidden_lines
from dsgd_teach.grading.values import encode

PS01 = Path(__file__).resolve().parents[1] / "course" / "assignments" / "source" / "ps01_sgd" / "ps01_sgd.ipynb"
SEED = 731_906_245


def _reference(assignment):
    def rec(label, v, hidden=False):
        return {"label": label, "value": encode(v), "rtol": 0.0, "atol": 0.0, "hidden": hidden, "hint": "",
                "solution_ok": True}
    ids = [q.grade_id for q in assignment.questions]
    return {"tests": {ids[0]: {"status": "ok", "error": "", "records": [rec("a", 1.0), rec("h", 2.0, True)]},
                      ids[1]: {"status": "ok", "error": "", "records": [rec("b", [1.0, 2.0])]},
                      ids[2]: {"status": "ok", "error": "", "records": [rec("c", 3.0)]}}}


def _student(assignment, q1_records, raw_q2='{"status": "ok", "error": "", "records": '
                                          '[{"label": "b", "value": {"t": "arr", "shape": [2], "v": [1.0, 2.0]}}]}'):
    """A worker result as raw JSON text: q1's records as given, q2 as given (raw), q3 honest."""
    ids = [q.grade_id for q in assignment.questions]
    q3 = {"status": "ok", "error": "", "records": [{"label": "c", "value": encode(3.0)}]}
    return ('{"tests": {' + json.dumps(ids[0]) + ': {"status": "ok", "error": "", "records": ' + q1_records + '}, '
            + json.dumps(ids[1]) + ": " + raw_q2 + ", " + json.dumps(ids[2]) + ": " + json.dumps(q3) + "}, "
            '"skipped": [], "flags": [], "cell_errors": []}').encode()


HOSTILE_Q1 = {
    "a string where a number is expected": '[{"label": "a", "value": {"t": "num", "v": "one"}}]',
    "an int too large for a float": '[{"label": "a", "value": {"t": "num", "v": 1' + "0" * 400 + '}}]',
    "a lone surrogate": '[{"label": "a", "error": "bad \\ud800 text"}]',
    "an array of objects": '[{"label": "a", "value": {"t": "arr", "shape": [1], "v": [{"x": 1}]}}]',
    "an unknown key": '[{"label": "a", "value": {"t": "num", "v": 1.0}, "points": 2}]',
    "deep nesting": '[{"label": "a", "value": ' + '{"t": "seq", "v": [' * 200 + "]}" * 200 + "}]",
    "a huge error": '[{"label": "a", "error": "' + "x\\n" * 3_000_000 + '"}]',
}


@pytest.mark.parametrize("what", sorted(HOSTILE_Q1))
def test_a_malformed_report_fails_its_own_check_and_is_flagged(what, monkeypatch, tmp_path):
    assignment = load_assignment(PS01)
    data = _student(assignment, HOSTILE_Q1[what])
    monkeypatch.setattr(batch, "run_worker", lambda *a, **k: batch._parse_result(data, 0, "", "student"))
    sub = Submission("mallory", "ps01_sgd", PS01)
    grades = grade_one(sub, assignment, _reference(assignment), Limits(), SEED, [])
    by_q = {g.question: g for g in grades}
    ids = [q.grade_id for q in assignment.questions]
    assert by_q[ids[0]].points == 0
    assert by_q[ids[1]].points == 2 and by_q[ids[2]].points == 2, grades  # the other questions still count
    if what not in ("a lone surrogate", "a huge error"):
        assert by_q["(integrity)"].reason.startswith("FLAGGED"), grades
    sub.grades = grades
    text = _csv_text([sub], True)  # renders, and is valid UTF-8 of bounded size
    text.encode("utf-8")
    assert len(text) < 4000 and len(text.splitlines()) == len(grades) + 1
    write_feedback(tmp_path / "fb.html", sub.student, sub.assignment, grades, root=tmp_path)


def test_a_result_that_breaks_the_schema_whole_zeroes_that_submission_only():
    for data in (b"[1, 2]", b'{"tests": {}, "extra": 1}', b'{"tests": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", b"x" * (reports.MAX_RESULT_BYTES + 1)):
        out = batch._parse_result(data, 0, "", "student")
        assert "error" in out and out["problems"], out


def test_reasons_are_short_single_lines_of_valid_utf8():
    assert clean("a\nb\r\x1b[31m\u202e\ud800" + "y" * 5000) .startswith("a\\nb\\r\\x1b[31m\\u202e\\ud800y")
    assert len(clean("y" * 5000)) <= 400
    assert clean(clean("tab\there\\n")) == clean("tab\there\\n")
    clean("\ud800").encode("utf-8")


def test_reasons_quoting_hidden_tests_or_the_seed_are_withheld():
    assignment = load_assignment(PS01)
    redactor = Redactor.for_assignment(assignment, SEED)
    q1 = assignment.questions[0].source
    lines = hidden_lines(q1)
    assert any("_dsgd_record" in ln for ln in lines) and any("_ref_batch" in ln for ln in lines)
    for line in lines:
        if len(line.strip()) >= 12:
            assert redactor(f"oops: {line}") == REDACTED, line
            assert redactor(f"oops: {' '.join(line)}") == REDACTED, line  # spacing does not hide it
    assert redactor(f"seed {SEED}") == REDACTED
    assert redactor("check 'a' failed: expected 1, got 2") != REDACTED


def test_a_report_quoting_the_hidden_test_never_reaches_the_files(monkeypatch):
    assignment = load_assignment(PS01)
    leak = "\\n".join(hidden_lines(assignment.questions[0].source)) + f" seed={SEED}"
    data = _student(assignment, json.dumps([{"label": "a", "error": leak}]))
    monkeypatch.setattr(batch, "run_worker", lambda *a, **k: batch._parse_result(data, 0, "", "student"))
    sub = Submission("mallory", "ps01_sgd", PS01)
    sub.grades = grade_one(sub, assignment, _reference(assignment), Limits(), SEED, [])
    text = _csv_text([sub], True)
    assert str(SEED) not in text and "_ref_batch" not in text and "FLAGGED" in text
    rows = list(csv.DictReader(io.StringIO(text)))
    assert all(len(r["reason"]) <= 400 for r in rows)


def test_nan_and_infinities_travel_by_name_and_compare_as_numbers():
    """JSON (and a kernel's messages) carry no NaN or infinity: encode names them, the report parser keeps the
    names, and comparison reads them as numbers; a student's NaN fails its check instead of breaking the report."""
    import numpy as np

    from dsgd_teach.grading.values import same

    sent = encode(np.array([1.0, np.inf, -np.inf]))
    back = reports.value(json.loads(json.dumps(sent, allow_nan=False)), [reports.MAX_SCALARS])
    assert same(back, encode([1.0, float("inf"), float("-inf")]))
    assert not same(back, encode([1.0, float("inf"), float("inf")]))
    nan = reports.value(json.loads(json.dumps(encode(float("nan")), allow_nan=False)), [reports.MAX_SCALARS])
    assert nan == {"t": "num", "v": "nan"} and not same(nan, encode(float("nan")))
    assert not same(encode("inf"), encode(float("inf")))  # the text "inf" is a string, not infinity
