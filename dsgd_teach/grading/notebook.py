"""Read nbgrader source notebooks, rebuild a submission with the source's test cells, and rewrite test cells.

A submission's test cells are never executed as the student left them: every cell whose grade_id is a test (or a
locked cell) in the source is replaced by the source's version, hidden tests included; missing ones are appended.
"""

from __future__ import annotations

import ast
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat

# CPython 3.11's AST constructor keeps shared recursion state: parsing from two grading threads at once can
# raise SystemError, so parses are serialised.
_PARSE_LOCK = threading.Lock()

HIDDEN_BEGIN, HIDDEN_END = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"
RECORD, REFERENCE = "_dsgd_record", "_dsgd_reference"


@dataclass(frozen=True)
class Question:
    """One graded test cell of an assignment."""

    grade_id: str
    points: float
    source: str


@dataclass(frozen=True)
class Assignment:
    """A source notebook held in memory: its cells and its questions in order."""

    name: str
    notebook: Any
    questions: tuple[Question, ...]

    @property
    def max_points(self) -> float:
        return sum(q.points for q in self.questions)


def nbgrader_meta(cell: Any) -> dict[str, Any]:
    """The cell's nbgrader metadata ({} when absent or malformed)."""
    meta = cell.get("metadata", {}).get("nbgrader", {})
    return meta if isinstance(meta, dict) else {}


def load_assignment(path: Path) -> Assignment:
    """Read a source notebook once into memory; the grader never gives its path to a student's kernel."""
    nb = nbformat.read(str(path), as_version=4)
    questions = []
    for cell in nb.cells:
        meta = nbgrader_meta(cell)
        if cell.cell_type == "code" and meta.get("grade") and not meta.get("solution"):
            questions.append(Question(str(meta["grade_id"]), float(meta.get("points", 0)), cell.source))
    if not questions:
        raise ValueError(f"{path} has no graded test cells")
    return Assignment(path.parent.name, nb, tuple(questions))


def find_assignments(source_dir: Path) -> dict[str, Path]:
    """{assignment name: source notebook path} for source_dir/<name>/<notebook>.ipynb."""
    found = {}
    for sub in sorted(p for p in source_dir.iterdir() if p.is_dir()):
        notebooks = sorted(sub.glob("*.ipynb"))
        if notebooks:
            found[sub.name] = notebooks[0]
    return found


def rebuild(assignment: Assignment, submission: Any) -> list[dict[str, Any]]:
    """Cells to execute for a submission: the student's code cells, with every protected cell from the source.

    Returns [{"source", "grade_id" (test cells only)}]; student cells pretending to be tests are run as plain code
    (their metadata is ignored), and a student cell reusing a protected grade_id is replaced by the source cell.
    """
    protected = {}
    for cell in assignment.notebook.cells:
        meta = nbgrader_meta(cell)
        if cell.cell_type == "code" and not meta.get("solution") and (meta.get("grade") or meta.get("locked")):
            protected[str(meta.get("grade_id"))] = cell
    tests = {q.grade_id for q in assignment.questions}
    used: set[str] = set()
    cells: list[dict[str, Any]] = []
    for cell in getattr(submission, "cells", []):
        if cell.get("cell_type") != "code":
            continue
        gid = str(nbgrader_meta(cell).get("grade_id", ""))
        if gid in protected:
            if gid not in used:
                used.add(gid)
                cells.append(_entry(protected[gid], gid, tests))
            continue
        cells.append({"source": str(cell.get("source", ""))})
    for gid, cell in protected.items():
        if gid not in used:
            cells.append(_entry(cell, gid, tests))
    return cells


def source_cells(assignment: Assignment) -> list[dict[str, Any]]:
    """The source notebook's own code cells (solutions included), for the reference run."""
    tests = {q.grade_id for q in assignment.questions}
    return [
        _entry(cell, str(nbgrader_meta(cell).get("grade_id", "")), tests)
        for cell in assignment.notebook.cells
        if cell.cell_type == "code"
    ]


def _entry(cell: Any, gid: str, tests: set[str]) -> dict[str, Any]:
    entry = {"source": cell.source}
    if gid in tests:
        entry["grade_id"] = gid
    return entry


def hidden_line_numbers(source: str) -> set[int]:
    """1-based numbers of the lines between the hidden-test markers of a test cell."""
    lines, inside = set(), False
    for number, line in enumerate(source.splitlines(), start=1):
        if HIDDEN_BEGIN in line:
            inside = True
        elif HIDDEN_END in line:
            inside = False
        elif inside:
            lines.add(number)
    return lines


def visible_source(source: str) -> str:
    """A test cell as nbgrader releases it: the hidden-test blocks, markers included, removed."""
    hidden = hidden_line_numbers(source)
    kept = [line for n, line in enumerate(source.splitlines(), start=1)
            if n not in hidden and HIDDEN_BEGIN not in line and HIDDEN_END not in line]
    return "\n".join(kept) + "\n" if kept else "pass\n"


def _is_check(node: ast.AST) -> bool:
    func = getattr(node, "func", None)
    return isinstance(node, ast.Call) and (
        (isinstance(func, ast.Name) and func.id == "check") or (isinstance(func, ast.Attribute) and func.attr == "check")
    )


def _bind(call: ast.Call) -> dict[str, ast.expr]:
    names = ["label", "got", "expect"]
    bound = dict(zip(names, call.args, strict=False))
    bound.update({kw.arg: kw.value for kw in call.keywords if kw.arg})
    missing = [n for n in names if n not in bound]
    if missing or len(call.args) > 3:
        raise ValueError(f"check() at line {call.lineno} must be check(label, got, expect, rtol=, atol=, hint=)")
    return bound


class _Rewrite(ast.NodeTransformer):
    def __init__(self, mode: str, hidden: set[int]) -> None:
        self.mode, self.hidden = mode, hidden

    def generic_visit(self, node: ast.AST) -> ast.AST:
        node = super().generic_visit(node)
        for name in ("body", "orelse", "finalbody"):
            block = getattr(node, name, None)
            if isinstance(block, list) and block and all(isinstance(s, ast.stmt) for s in block):
                kept = [s for s in block if not (self.mode == "student" and _defines_ref(s))]
                setattr(node, name, kept or ([ast.Pass()] if name == "body" and not isinstance(node, ast.Module)
                                             else kept))
        return node

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        if not _is_check(node):
            return node
        b = _bind(node)
        if self.mode == "student":
            return ast.Call(ast.Name(RECORD, ast.Load()), [b["label"], b["got"]], [])
        keywords = [ast.keyword(k, b[k]) for k in ("rtol", "atol", "hint") if k in b]
        keywords.append(ast.keyword("hidden", ast.Constant(node.lineno in self.hidden)))
        return ast.Call(ast.Name(REFERENCE, ast.Load()), [b["label"], b["got"], b["expect"]], keywords)


def rewrite_test(source: str, mode: str) -> str:
    """A test cell rewritten for grading: check() reports values ("student") or expected values ("reference").

    In student mode the expected values, and every top-level definition named `_ref*` (hidden oracles), are
    removed (at any depth), so nothing in the student's kernel computes the right answers. Mode "visible" (a
    student's pre-flight check) keeps the cell as released: `check` as written, the hidden blocks cut.
    """
    if mode == "visible":
        return visible_source(source)
    with _PARSE_LOCK:
        parsed = ast.parse(source)
    tree = _Rewrite(mode, hidden_line_numbers(source)).visit(parsed)
    ast.fix_missing_locations(tree)
    return ast.unparse(tree)


def _defines_ref(stmt: ast.stmt) -> bool:
    """True for a `_ref*` function/class, or a simple statement that touches a `_ref*` name (an oracle step)."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return stmt.name.startswith("_ref")
    if isinstance(stmt, (ast.For, ast.AsyncFor, ast.While, ast.If, ast.With, ast.AsyncWith, ast.Try)):
        return False
    return any(isinstance(n, ast.Name) and n.id.startswith("_ref") for n in ast.walk(stmt))
