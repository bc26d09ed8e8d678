"""Grade a solution variant in-process through the real verdict pipeline (no kernel, no sandbox): fast enough for
many hidden-input seeds.

The source notebook's cells run in a fresh namespace. Test cells are rewritten exactly as the grader rewrites them
(`notebook.rewrite_test`): in "reference" mode with the source's own solutions, in "student" mode with a variant's
code appended to the solution cell that defines the functions it replaces. `verdict.grade` then compares the two
reports as it does for a real batch.
"""

from __future__ import annotations

import ast
import copy
import functools
import os
import warnings
from dataclasses import dataclass
from typing import Any

from dsgd_teach.grading.notebook import Assignment, load_assignment, nbgrader_meta, rewrite_test
from dsgd_teach.grading.paths import default_source_dir
from dsgd_teach.grading.values import encode, same
from dsgd_teach.grading.verdict import Grade, check_reference, grade


@dataclass(frozen=True)
class Variant:
    """One solution to grade: `code` redefines some of the assignment's functions (a single change each)."""

    name: str
    question: str  # the grade_id suffix it targets, e.g. "q2"
    correct: bool
    code: str


@functools.cache
def swap(source: str, *pairs: tuple[str, str]) -> str:
    """A reference solution with each (old, new) pair replaced; an old text missing from it is an error, not a
    mutant that silently equals the reference."""
    for old, new in pairs:
        if old not in source:
            raise ValueError(f"mutant's text to replace is not in the reference: {old!r}")
        source = source.replace(old, new)
    return source


def W(name: str, question: str, code: str) -> Variant:  # noqa: N802 - a table reads better with short names
    """A wrong solution: one realistic mistake; it must lose points at every seed."""
    return Variant(name, question, False, code.strip() + "\n")


def R(name: str, question: str, code: str) -> Variant:  # noqa: N802
    """A right solution written differently from the reference; it must get full marks at every seed."""
    return Variant(name, question, True, code.strip() + "\n")


def assignment(name: str) -> Assignment:
    source = default_source_dir()
    return load_assignment(source / name / f"{name}.ipynb")


@functools.lru_cache(maxsize=4096)
def _compiled(source: str, name: str) -> Any:
    return compile(source, name, "exec")


@functools.lru_cache(maxsize=4096)
def _rewritten(source: str, mode: str) -> str:
    return rewrite_test(source, mode)


@functools.lru_cache(maxsize=4096)
def _defined(source: str) -> frozenset[str]:
    return frozenset(n.name for n in ast.parse(source).body if isinstance(n, (ast.FunctionDef, ast.ClassDef)))


def cells(a: Assignment, mode: str, code: str = "") -> list[tuple[str, str | None]]:
    """(source to execute, test grade_id or None) for every code cell, the variant's code placed after the last
    solution cell that defines one of the functions it replaces."""
    tests = {q.grade_id for q in a.questions}
    replaced = _defined(code) if code else set()
    out, target = [], None
    for cell in a.notebook.cells:
        if cell.cell_type != "code":
            continue
        meta = nbgrader_meta(cell)
        gid = str(meta.get("grade_id", ""))
        if gid in tests:
            out.append((_rewritten(cell.source, mode), gid))
        else:
            out.append((cell.source, None))
            if meta.get("solution") and replaced & _defined(cell.source):
                target = len(out) - 1
    if code:
        if target is None:
            raise ValueError(f"{a.name}: no solution cell defines {sorted(replaced)}")
        out[target] = (out[target][0] + "\n\n" + code, None)
    return out


def run(a: Assignment, mode: str, seed: int, code: str = "", *, plan: list[tuple[str, str | None]] | None = None,
        extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Execute the notebook in-process (or the cells of `plan`, with `extra` in the namespace); returns the report a
    worker would send (tests, cell_errors)."""
    records: list[dict[str, Any]] = []

    def _record(label: Any, got: Any) -> None:
        try:
            records.append({"label": str(label), "value": encode(got)})
        except Exception as exc:  # noqa: BLE001 - as probe.record
            records.append({"label": str(label), "error": f"{type(exc).__name__}: {exc}"})

    def _reference(label: Any, got: Any, expect: Any, *, rtol: float = 0.0, atol: float = 0.0,
                   hidden: bool = False, hint: str = "") -> None:
        exp = encode(expect)
        try:
            ok = same(encode(got), exp, rtol, atol)
        except Exception:  # noqa: BLE001
            ok = False
        records.append({"label": str(label), "value": exp, "rtol": rtol, "atol": atol, "hidden": hidden,
                        "hint": hint, "solution_ok": ok})

    ns: dict[str, Any] = {"__name__": "__main__", "_dsgd_record": _record, "_dsgd_reference": _reference, **(extra or {})}
    tests: dict[str, Any] = {}
    errors = []
    old = os.environ.get("DSGD_GRADER_SEED")
    os.environ["DSGD_GRADER_SEED"] = str(seed)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for index, (source, gid) in enumerate(cells(a, mode, code) if plan is None else plan):
                records.clear()
                status, error = "ok", ""
                try:
                    exec(_compiled(source, f"<{a.name} cell {index}>"), ns)  # noqa: S102 - our own sources
                except Exception as exc:  # noqa: BLE001 - a failing cell is the variant's failure
                    status, error = "error", f"{type(exc).__name__}: {exc}"[:500]
                    if gid is None:
                        errors.append({"index": index, "error": error})
                if gid is not None:
                    tests[gid] = {"status": status, "records": list(records), "error": error}
    finally:
        if old is None:
            os.environ.pop("DSGD_GRADER_SEED", None)
        else:
            os.environ["DSGD_GRADER_SEED"] = old
    return {"tests": tests, "cell_errors": errors}


def reference(a: Assignment, seed: int) -> dict[str, Any]:
    """The reference report at a seed, checked as a batch checks it (the source must pass its own tests)."""
    ref = run(a, "reference", seed)
    check_reference(a, ref)
    return ref


def without_lines(a: Assignment, grade_id: str, text: str) -> Assignment:
    """A copy of the assignment whose test cell `grade_id` lacks every line containing `text` (to show that the
    mutation suite notices a single removed check)."""
    nb = copy.deepcopy(a.notebook)
    found = 0
    for cell in nb.cells:
        if str(nbgrader_meta(cell).get("grade_id", "")) == grade_id:
            lines = cell.source.splitlines()
            kept = [line for line in lines if text not in line]
            found, cell.source = len(lines) - len(kept), "\n".join(kept)
    if not found:
        raise ValueError(f"{grade_id} has no line with {text!r}")
    return Assignment(a.name, nb, a.questions)


def grade_variant(a: Assignment, ref: dict[str, Any], variant: Variant, seed: int) -> list[Grade]:
    return grade(a, ref, run(a, "student", seed, variant.code))


def score(grades: list[Grade]) -> tuple[float, float]:
    return sum(g.points for g in grades), sum(g.max_points for g in grades)
