"""`dsgd-teach check NOTEBOOK`: a student's pre-flight check, the visible tests in the grader's own sandbox.

The notebook is rebuilt as the grader rebuilds it (test cells restored from the assignment by grade_id), but every
test cell keeps only its visible checks, as released: the hidden-test blocks are cut in this process before
anything reaches the sandbox, so no hidden test runs, and none can be printed. Each question prints PASS or FAIL
with the visible check's own message (expected, got, hint). Passing here says nothing of the hidden checks.

Students have no assignment sources: a released notebook (nbgrader's `generate_assignment`, `make assignments`) is
checked with its own locked cells, as released (they hold the visible tests only). nbgrader recorded each locked
cell's checksum; a test or setup cell that no longer matches it was edited, and the question it belongs to fails
saying so (the checksum guards against accidents, not against a student: the grader always restores the source's
cells). With `--source DIR` (an instructor) the test cells come from the sources, as the grader takes them.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path
from typing import Any

from nbformat import NotebookNode

from . import bubblewrap, container
from .batch import Limits, run_worker
from .checks import DEFAULT_SEED
from .notebook import (
    HIDDEN_BEGIN,
    Assignment,
    Question,
    find_assignments,
    load_assignment,
    nbgrader_meta,
    rebuild,
    visible_source,
)
from .paths import default_source_dir
from .submissions import read_notebook
from .text import Redactor, clean

HOW = "dsgd-teach check NOTEBOOK.ipynb"


def build_parser() -> argparse.ArgumentParser:
    """The `check` sub-command's arguments."""
    p = argparse.ArgumentParser(prog="dsgd-teach check",
                                description="Run a notebook's visible tests in the grader's sandbox (no hidden tests).")
    p.add_argument("notebook", type=Path, help="your assignment notebook (.ipynb)")
    p.add_argument("--assignment", default=None, help="which assignment (default: from the notebook's name or folder)")
    p.add_argument("--source", type=Path, default=None,
                   help="assignment sources (instructors; default: the released notebook's own locked test cells, "
                        "else course/assignments/source)")
    p.add_argument("--timeout", type=int, default=60, help="seconds per cell (default 60)")
    p.add_argument("--notebook-s", type=int, default=600, help="wall-clock seconds for the notebook (default 600)")
    p.add_argument("--memory-mb", type=int, default=1536, help="address-space limit of the kernel (default 1536)")
    p.add_argument("--container-mode", action="store_true", help="where bubblewrap cannot start, use container mode")
    p.add_argument("--unsafe-no-sandbox", action="store_true", help="run without the OS sandbox (your own code only)")
    return p


def nbgrader_checksum(cell: Any) -> str:
    """nbgrader's checksum of a cell (nbgrader.utils.compute_checksum, without importing nbgrader): md5 of the
    source, the cell type, whether it is graded, a solution, locked, its grade_id and, if graded, its points."""
    meta = nbgrader_meta(cell)
    grade, solution = bool(meta.get("grade", False)), bool(meta.get("solution", False))
    locked = False if solution else True if grade else bool(meta.get("locked", False))
    parts = [str(cell.get("source", "")), str(cell.get("cell_type", "")), str(grade), str(solution), str(locked),
             str(meta.get("grade_id", ""))]
    if grade:
        parts.append(str(float(meta.get("points", 0))))
    m = hashlib.md5(usedforsecurity=False)
    for part in parts:
        m.update(part.encode("utf-8"))
    return m.hexdigest()


EDITED = ("raise RuntimeError('this locked cell ({gid}) was edited after its release (its nbgrader checksum no longer "
          "matches): restore it from the released notebook; the grader runs the original')\n")


def released_assignment(notebook: Any, name: str) -> Assignment | None:
    """The assignment as a released notebook carries it (its locked cells, checksummed by nbgrader), or None when
    the notebook holds no released test cell. A locked cell edited since its release raises when run."""
    cells, questions, released = [], [], False
    for cell in notebook.cells:
        meta = nbgrader_meta(cell)
        locked = cell.get("cell_type") == "code" and not meta.get("solution") and (meta.get("grade") or
                                                                                    meta.get("locked"))
        if locked and "checksum" in meta:
            gid = str(meta.get("grade_id", ""))
            source = visible_source(cell.source) if HIDDEN_BEGIN in cell.source else cell.source
            if nbgrader_checksum(cell) != meta["checksum"]:
                source = EDITED.format(gid=gid.replace("'", ""))
            cell = NotebookNode({**cell, "source": source})
            released = released or bool(meta.get("grade"))
            if meta.get("grade"):
                questions.append(Question(gid, float(meta.get("points", 0)), source))
        cells.append(cell)
    if not released:
        return None
    return Assignment(name, NotebookNode({**notebook, "cells": cells}), tuple(questions))


def visible_cells(assignment: Assignment, notebook: Any) -> list[dict[str, Any]]:
    """The cells the grader would run, with every hidden-test block cut (test cells and any other source cell)."""
    return [{**c, "source": visible_source(c["source"])} if HIDDEN_BEGIN in c["source"] else c
            for c in rebuild(assignment, notebook)]


def outcomes(assignment: Assignment, result: dict[str, Any]) -> list[tuple[str, float, bool, str]]:
    """(question, points, passed, message) per question, from the worker's result of a "visible" run."""
    redact = Redactor.for_assignment(assignment, DEFAULT_SEED)
    out = []
    for q in assignment.questions:
        test = (result.get("tests") or {}).get(q.grade_id)
        if "error" in result:
            ok, why = False, str(result["error"])
        elif test is None:
            ok, why = False, "the test cell was not run"
        elif test.get("status") == "ok":
            ok, why = True, "visible checks passed"
        elif test.get("status") == "error":
            ok, why = False, str(test.get("error") or "the test cell raised an error")
            if why.startswith("NotImplementedError"):
                why += (" (a function this question's checks call is still the released stub: write it where it "
                        "says `raise NotImplementedError()`, then check again)")
        else:
            ok, why = False, f"{test.get('status')}: {test.get('error', '')}"
        out.append((q.grade_id, q.points, ok, redact(clean(why, 600, escape=False))))
    return out


def _assignment_for(notebook: Path, sources: dict[str, Path], name: str | None) -> str:
    if name is not None:
        if name not in sources:
            raise ValueError(f"unknown assignment {name!r}; known: {', '.join(sources)}")
        return name
    for part in (notebook.stem, notebook.parent.name):
        if part in sources:
            return part
    raise ValueError(f"cannot tell which assignment {notebook.name} is; pass --assignment (one of {', '.join(sources)})")


def main(argv: list[str]) -> int:
    """0 when every visible check passes, 1 when one fails, 2 on a usage error or when no sandbox can be built."""
    args = build_parser().parse_args(argv)
    sandbox = container.select(args.unsafe_no_sandbox, args.container_mode or container.enabled())
    source = args.source or default_source_dir()
    try:
        notebook = read_notebook(args.notebook)
        assignment = None
        if args.source is None:
            assignment = released_assignment(notebook, args.assignment or args.notebook.stem)
        if assignment is None:
            if source is None or not source.is_dir():
                raise ValueError(f"{args.notebook.name} is not a released assignment notebook (no locked test cells "
                                 "with nbgrader's checksums) and no assignment sources were found; pass --source DIR")
            sources = find_assignments(source)
            assignment = load_assignment(sources[_assignment_for(args.notebook, sources, args.assignment)])
        name = assignment.name
        cells = visible_cells(assignment, notebook)
        if sandbox:
            container.require() if sandbox == "container" else bubblewrap.require()
    except (ValueError, OSError, RuntimeError) as exc:
        print(f"error: {clean(exc, 600)}", file=sys.stderr)
        return 2
    protected = [str(source.resolve())] if source is not None and source.is_dir() else []
    limits = Limits(args.timeout, args.memory_mb, 600, args.notebook_s)
    result = run_worker(cells, "visible", limits, DEFAULT_SEED, protected, sandbox=sandbox)
    rows = outcomes(assignment, result)
    print(f"{name}: visible checks of {args.notebook.name}, run in the grader's sandbox "
          f"({'bubblewrap' if sandbox is True else container.LABEL if sandbox else 'NO sandbox'})")
    for gid, points, ok, why in rows:
        print(f"  {'PASS' if ok else 'FAIL'}  {gid} ({points:g} points)" + ("" if ok else "\n        " + why.replace("\n", "\n        ")))
    passed = sum(ok for _, _, ok, _ in rows)
    print(f"{passed} of {len(rows)} question(s) pass their visible checks. Hidden checks run only when graded.")
    return 0 if passed == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
