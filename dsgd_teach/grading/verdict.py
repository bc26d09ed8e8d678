"""Decide each question's points in the grader's process, from what the student's and the reference kernels reported."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .notebook import Assignment
from .values import describe, same, show


@dataclass(frozen=True)
class Grade:
    """Points for one question and why."""

    question: str
    points: float
    max_points: float
    reason: str


class ReferenceError_(RuntimeError):
    """The source notebook does not pass its own tests (an instructor error, not a student's)."""


def check_reference(assignment: Assignment, reference: dict[str, Any]) -> None:
    """Raise unless every test cell of the source ran cleanly and the solution matched every expected value."""
    for q in assignment.questions:
        ref = reference["tests"].get(q.grade_id, {})
        bad = [r["label"] for r in ref.get("records", []) if not r.get("solution_ok")]
        if ref.get("status") != "ok" or bad or not ref.get("records"):
            raise ReferenceError_(
                f"{assignment.name}: the source's own solution fails {q.grade_id} "
                f"(status {ref.get('status')}, {ref.get('error') or ''}; failing checks: {bad})"
            )


def partial_credit(assignment: Assignment) -> bool:
    """Whether the source notebook awards points per hidden check (`metadata.dsgd_teach.partial_credit`)."""
    meta = assignment.notebook.get("metadata", {}).get("dsgd_teach", {})
    return bool(meta.get("partial_credit", False)) if isinstance(meta, dict) else False


def _test_meta(assignment: Assignment, grade_id: str) -> dict[str, Any]:
    """The `metadata.dsgd_teach` dict of the test cell `grade_id` ({} when it has none)."""
    for cell in assignment.notebook.cells:
        if str(cell.get("metadata", {}).get("nbgrader", {}).get("grade_id", "")) == grade_id:
            meta = cell.get("metadata", {}).get("dsgd_teach", {})
            return meta if isinstance(meta, dict) else {}
    return {}


def check_weights(assignment: Assignment, grade_id: str) -> list[tuple[str, float]]:
    """(label prefix, weight) pairs from the test cell's `metadata.dsgd_teach.weights`; other checks weigh 1."""
    weights = _test_meta(assignment, grade_id).get("weights", {})
    if not isinstance(weights, dict):
        return []
    return [(str(k), float(v)) for k, v in weights.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0]


def check_guards(assignment: Assignment, grade_id: str) -> list[str]:
    """Label fragments of the test cell's `metadata.dsgd_teach.guards`: checks a function doing nothing passes."""
    guards = _test_meta(assignment, grade_id).get("guards", [])
    return [str(g) for g in guards if isinstance(g, str) and g] if isinstance(guards, list) else []


def weight_of(label: str, weights: list[tuple[str, float]]) -> float:
    """The weight of a hidden check: that of the longest matching label prefix, else 1."""
    found = [(len(prefix), w) for prefix, w in weights if label.startswith(prefix)]
    return max(found)[1] if found else 1.0


def credited(hidden: list[tuple[dict[str, Any], str]], guards: Sequence[str]) -> list[bool]:
    """Which hidden checks earn their weight: a passed value check; a passed guard (an invariant such as "leaves
    the input alone", or a value any stub gives) only when the value check reported before it passed too."""
    out, value_ok = [], False
    for exp, outcome in hidden:
        if any(g in exp["label"] for g in guards):
            out.append(outcome == "passed" and value_ok)
        else:
            value_ok = outcome == "passed"
            out.append(value_ok)
    return out


def grade(assignment: Assignment, reference: dict[str, Any], student: dict[str, Any]) -> list[Grade]:
    """One Grade per question.

    All or nothing by default: full points only if the test ran cleanly and every reported value matches. With
    partial credit (set in the source notebook), a question whose visible checks all pass and whose reports are
    well formed earns its points in proportion to the weights of the hidden checks that pass.
    """
    skipped = student.get("skipped", [])
    notes = [f"cell {s['index'] + 1} was skipped ({s['why']})" for s in skipped if s.get("index", -1) >= 0]
    notes += [f"cell {e['index'] + 1} raised {e['error']}" for e in student.get("cell_errors", [])[:3]]
    notes += [student["stopped"]] if student.get("stopped") else []
    note = "; ".join(notes)
    grades = []
    problems = list(student.get("problems", []))
    partial = partial_credit(assignment)
    for q in assignment.questions:
        points = 0.0
        try:
            expected = reference["tests"][q.grade_id]["records"]
            result = student.get("tests", {}).get(q.grade_id)
            reason = _failure(expected, result)
            if reason and partial:
                points, reason = _partial(expected, result, q.points, check_weights(assignment, q.grade_id), reason,
                                          check_guards(assignment, q.grade_id))
        except Exception as exc:  # noqa: BLE001 - a report the grader cannot compare fails its question only
            points, reason = 0.0, f"the check reports could not be compared ({type(exc).__name__})"
            problems.append(f"{q.grade_id}: {reason}")
        if reason and note:
            reason += f" [{note}]"
        grades.append(Grade(q.grade_id, points if reason else q.points, q.points, reason or "passed"))
    flags = problems + [f"the sandbox denied {f}" for f in student.get("flags", [])]
    if flags:
        grades.append(Grade("(integrity)", 0.0, 0.0, "FLAGGED: " + "; ".join(flags[:5])))
    return grades


def check_outcomes(expected: list[dict[str, Any]], result: dict[str, Any] | None) -> list[str] | None:
    """Each reference check's outcome ("passed", "failed", "not reached"), or None when the reports are not
    well formed (missing test, wrong or extra labels): such a test earns nothing."""
    if result is None or result.get("status") not in ("ok", "error"):
        return None
    got = result.get("records", [])
    if len(got) > len(expected):
        return None
    out = []
    for k, exp in enumerate(expected):
        if k >= len(got):
            out.append("not reached")
            continue
        rec = got[k]
        if not isinstance(rec, dict) or rec.get("label") != exp["label"]:
            return None
        try:
            ok = "error" not in rec and same(rec["value"], exp["value"], exp.get("rtol", 0.0), exp.get("atol", 0.0))
        except (KeyError, TypeError, AttributeError):
            ok = False
        out.append("passed" if ok else "failed")
    return out


def _partial(expected: list[dict[str, Any]], result: dict[str, Any] | None, points: float,
             weights: list[tuple[str, float]], reason: str, guards: Sequence[str] = ()) -> tuple[float, str]:
    """(points, reason) of a test that did not fully pass, under partial credit: guards count only beside a
    passing value check (`credited`), so a function that does nothing earns nothing."""
    outcomes = check_outcomes(expected, result)
    hidden = [(exp, o) for exp, o in zip(expected, outcomes or [], strict=False) if exp.get("hidden")]
    if outcomes is None or not hidden:
        return 0.0, reason
    if any(o != "passed" for exp, o in zip(expected, outcomes, strict=True) if not exp.get("hidden")):
        return 0.0, reason  # the visible checks are the gate: the student can run them before submitting
    if all(o == "passed" for _, o in hidden):  # every check matched, but the cell raised afterwards
        return 0.0, reason
    counts = credited(hidden, guards)
    total = sum(weight_of(exp["label"], weights) for exp, _ in hidden)
    won = sum(weight_of(exp["label"], weights) for (exp, _), c in zip(hidden, counts, strict=True) if c)
    earned = round(points * won / total, 2) if total else 0.0
    passed = sum(counts)
    if not passed or not earned:
        return 0.0, reason
    missed = [f"'{exp['label']}' ({o})" for exp, o in hidden if o != "passed"][1:]  # the first is in `reason`
    listed = ", ".join(missed[:3]) + (f" and {len(missed) - 3} more" if len(missed) > 3 else "")
    also = f"; also not passed: {listed}" if missed else ""
    return earned, f"{reason}; partial credit {earned:g} of {points:g}: {passed} of {len(hidden)} hidden checks passed{also}"


def _failure(expected: list[dict[str, Any]], result: dict[str, Any] | None) -> str:
    """Why a test failed ('' if it passed)."""
    if result is None:
        return "the test cell was not run"
    if result["status"] not in ("ok", "error"):
        return f"{result['status']}: {result['error']}"
    got = result.get("records", [])
    for k, exp in enumerate(expected):
        where = "hidden check" if exp.get("hidden") else "check"
        if k >= len(got):
            why = result["error"] or "no error was reported; was the test tampered with?"
            return f"{where} '{exp['label']}' never reported a value: the test stopped early ({why})"
        rec = got[k]
        if not isinstance(rec, dict) or rec.get("label") != exp["label"]:
            return f"unexpected test output instead of {where} '{exp['label']}' (tampered output?)"
        if "error" in rec:
            if exp.get("hidden"):  # only the exception's name: the text is the student's, and may quote the test
                name = re.match(r"[A-Za-z_][\w.]{0,60}", str(rec["error"]))
                return f"{where} '{exp['label']}': your value could not be checked ({name and name.group(0)})"
            return f"{where} '{exp['label']}': {rec['error']}"
        try:
            ok = same(rec["value"], exp["value"], exp.get("rtol", 0.0), exp.get("atol", 0.0))
        except (KeyError, TypeError, AttributeError):
            ok = False
        if not ok:
            if exp.get("hidden"):
                return f"hidden check '{exp['label']}' failed: {hidden_mismatch(exp, rec)}"
            hint = f"; hint: {exp['hint']}" if exp.get("hint") else ""
            return f"check '{exp['label']}' failed: expected {show(exp['value'])}, got {_show(rec)}{hint}"
    if len(got) > len(expected):
        return "the test reported more values than it checks (forged output?)"
    if result["status"] != "ok":
        return f"the test cell raised {result['error']}"
    return ""


def expected_in_words(exp: dict[str, Any]) -> str:
    """What a check expects, in words: kind, shape and tolerance (never the reference values)."""
    rtol, atol = exp.get("rtol", 0.0), exp.get("atol", 0.0)
    tol = f"within rtol={rtol:g}, atol={atol:g}" if rtol or atol else "matched exactly"
    return f"{describe(exp['value'])}, {tol}"


def hidden_mismatch(exp: dict[str, Any], rec: dict[str, Any]) -> str:
    """How a student's value differs from a hidden check's expectation, without revealing either's values."""
    try:
        got = describe(rec["value"])
    except (KeyError, TypeError, AttributeError):
        got = "an unreadable value"
    same_form = got == describe(exp["value"])
    tail = " (same kind and shape: the values differ)" if same_form else ""
    return f"expected {expected_in_words(exp)}; your code gave {got}{tail}"


def _show(rec: dict[str, Any]) -> str:
    try:
        return show(rec["value"])
    except (KeyError, TypeError, AttributeError):
        return "an unreadable value"
