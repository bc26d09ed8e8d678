"""What a student may see of a graded test cell: its visible code, and each check's verdict in words.

Hidden-test blocks and every line naming a `_ref*` oracle are cut from the cell; hidden checks are listed by label
with what they expect in words (kind, shape, tolerance) and whether the student's code matched, never the
reference code or the values of hidden inputs.
"""

from __future__ import annotations

import re
from typing import Any

import nbformat

from ..verdict import Grade, expected_in_words

HIDDEN_NOTE = "# (hidden checks, run by the grader, are listed in the output below)"
_HIDDEN_BEGIN = re.compile(r"BEGIN HIDDEN TESTS")
_HIDDEN_END = re.compile(r"END HIDDEN TESTS")
REF_PATTERN = re.compile(r"\b_ref")


def redact_source(source: str) -> str:
    """The cell without its hidden-test blocks and without any line that names a `_ref*` oracle."""
    kept: list[str] = []
    inside = False
    for line in source.splitlines():
        if _HIDDEN_BEGIN.search(line):
            inside = True
            if HIDDEN_NOTE not in kept:
                kept.append(HIDDEN_NOTE)
        elif inside and _HIDDEN_END.search(line):
            inside = False
        elif not inside and not REF_PATTERN.search(line):
            kept.append(line)
    return "\n".join(kept)


def redact_text(text: str) -> str:
    """Text output with any line that shows a hidden block or an oracle replaced by a marker."""
    lines = text.splitlines(keepends=True)
    return "".join("(redacted)\n" if REF_PATTERN.search(ln) or "HIDDEN TESTS" in ln else ln for ln in lines)


def check_statuses(records: list[dict[str, Any]], grade: Grade) -> list[tuple[dict[str, Any], str]]:
    """Each reference check with its status: passed, failed, or not reached (the verdict stops at a failure)."""
    if grade.points == grade.max_points:
        return [(r, "passed") for r in records]
    failing = next((k for k, r in enumerate(records) if f"'{r['label']}'" in grade.reason), None)
    if failing is None:
        return [(r, "not confirmed") for r in records]
    return [(r, "passed" if k < failing else "failed" if k == failing else "not reached")
            for k, r in enumerate(records)]


def verdict_lines(records: list[dict[str, Any]], grade: Grade) -> list[str]:
    """The verdict of one question as lines of text: points, reason, and one line per hidden check."""
    lines = [f"{grade.points:g} / {grade.max_points:g} points: {grade.reason}"]
    hidden = [(r, s) for r, s in check_statuses(records, grade) if r.get("hidden")]
    if hidden:
        lines.append(f"hidden checks ({len(hidden)}):")
        lines += [f"  - {r['label']}: expects {expected_in_words(r)} -> {status}" for r, status in hidden]
    return lines


def verdict_outputs(records: list[dict[str, Any]], grade: Grade) -> list[Any]:
    """nbformat outputs for a graded cell, read by nbgrader's determine_grade: the verdict as plain text when it
    earned full marks; the text and then an execute_result holding the points earned when partly right (nbgrader's
    partial credit); an error (scored 0) when it earned nothing."""
    lines = verdict_lines(records, grade)
    text = nbformat.v4.new_output("stream", name="stdout", text="\n".join(lines) + "\n")
    if grade.points == grade.max_points:
        return [text]
    if grade.points > 0:
        points = nbformat.v4.new_output("execute_result", data={"text/plain": f"{grade.points:g}"}, execution_count=None)
        return [text, points]
    return [nbformat.v4.new_output("error", ename="GradingVerdict", evalue=grade.reason, traceback=lines)]
