"""`dsgd-teach check NOTEBOOK`: a student's pre-flight check, the visible tests in the grader's own sandbox.

The notebook is rebuilt as the grader rebuilds it (test cells restored from the assignment by grade_id), but every
test cell keeps only its visible checks, as released: the hidden-test blocks are cut in this process before
anything reaches the sandbox, so no hidden test runs, and none can be printed. Each question prints PASS or FAIL
with the visible check's own message (expected, got, hint). Passing here says nothing of the hidden checks.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from . import bubblewrap, container
from .batch import Limits, run_worker
from .checks import DEFAULT_SEED
from .notebook import HIDDEN_BEGIN, Assignment, find_assignments, load_assignment, rebuild, visible_source
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
    p.add_argument("--source", type=Path, default=None, help="assignment sources (default: course/assignments/source)")
    p.add_argument("--timeout", type=int, default=60, help="seconds per cell (default 60)")
    p.add_argument("--notebook-s", type=int, default=600, help="wall-clock seconds for the notebook (default 600)")
    p.add_argument("--memory-mb", type=int, default=1536, help="address-space limit of the kernel (default 1536)")
    p.add_argument("--container-mode", action="store_true", help="where bubblewrap cannot start, use container mode")
    p.add_argument("--unsafe-no-sandbox", action="store_true", help="run without the OS sandbox (your own code only)")
    return p


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
    source = args.source or default_source_dir()
    if source is None or not source.is_dir():
        print("error: assignment sources not found; pass --source DIR", file=sys.stderr)
        return 2
    sandbox = container.select(args.unsafe_no_sandbox, args.container_mode or container.enabled())
    try:
        sources = find_assignments(source)
        name = _assignment_for(args.notebook, sources, args.assignment)
        assignment = load_assignment(sources[name])
        cells = visible_cells(assignment, read_notebook(args.notebook))
        if sandbox:
            container.require() if sandbox == "container" else bubblewrap.require()
    except (ValueError, OSError, RuntimeError) as exc:
        print(f"error: {clean(exc, 600)}", file=sys.stderr)
        return 2
    limits = Limits(args.timeout, args.memory_mb, 600, args.notebook_s)
    result = run_worker(cells, "visible", limits, DEFAULT_SEED, [str(source.resolve())], sandbox=sandbox)
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
