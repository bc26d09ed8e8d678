"""Grading time per notebook through nbgrader (`nbgrader autograde` with the dsgd-teach route) against
`dsgd-teach grade`, on the same submissions in the same run.

Run: python -m dsgd_teach.bench.nbgrader_route [N]. Both figures include their reference run; the nbgrader one
also includes nbgrader's own start-up, sanitizing and gradebook writes, which is what a TA waits for.
"""

from __future__ import annotations

import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import nbformat

from ..grading.batch import Limits, grade_batch
from ..grading.nbg.course import make_course, nbgrader
from ..grading.notebook import find_assignments, nbgrader_meta
from ..grading.paths import default_source_dir

ASSIGNMENT = "ps05_collectives"
_MARKERS = re.compile(r"[ \t]*### (BEGIN|END) SOLUTION\n?")


def _class(release: Path, source: Path, n: int, dest: Path) -> list[str]:
    """n submissions of the released notebook: two thirds answered with the solution, the rest left as stubs."""
    solutions = {nbgrader_meta(c).get("grade_id"): _MARKERS.sub("", c.source)
                 for c in nbformat.read(str(source), as_version=4).cells if nbgrader_meta(c).get("solution")}
    students = []
    for i in range(n):
        nb = nbformat.read(str(release), as_version=4)
        honest = i % 3 != 2
        for cell in nb.cells:
            if honest and nbgrader_meta(cell).get("solution"):
                cell.source = solutions[nbgrader_meta(cell)["grade_id"]]
        student = f"student{i:02d}"
        path = dest / student / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
        path.parent.mkdir(parents=True)
        nbformat.write(nb, str(path))
        students.append(student)
    return students


def measure(n: int = 6) -> dict[str, float]:
    """Seconds per notebook for n submissions of ps05 through both routes, and their ratio."""
    source_dir = default_source_dir()
    if source_dir is None:
        raise RuntimeError("course/assignments/source not found")
    source = find_assignments(source_dir)[ASSIGNMENT]
    with tempfile.TemporaryDirectory(prefix="dsgd-nbgrader-bench-") as tmp:
        root = Path(tmp) / "course"
        make_course(root, "bench", None, [ASSIGNMENT], source_dir)
        done = nbgrader(root, "generate_assignment", ASSIGNMENT, "--force")
        if done.returncode:
            raise RuntimeError(f"generate_assignment failed: {done.stderr[-2000:]}")
        _class(root / "release" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb", source, n, root / "submitted")
        t0 = time.perf_counter()
        done = nbgrader(root, "autograde", ASSIGNMENT, "--force")
        route_s = time.perf_counter() - t0
        if done.returncode:
            raise RuntimeError(f"nbgrader autograde failed: {done.stderr[-2000:]}")
        subs = Path(tmp) / "subs"
        shutil.copytree(root / "submitted", subs)
        t0 = time.perf_counter()
        graded = grade_batch(subs, source_dir, Path(tmp) / "out", assignment=ASSIGNMENT, limits=Limits(), jobs=1,
                             progress=False)
        grade_s = time.perf_counter() - t0
    full = sum(all(g.points == g.max_points for g in s.grades) for s in graded)
    return {"submissions": float(n), "nbgrader_route_s": round(route_s, 1), "dsgd_grade_s": round(grade_s, 1),
            "nbgrader_route_per_notebook_s": round(route_s / n, 2), "dsgd_grade_per_notebook_s": round(grade_s / n, 2),
            "nbgrader_route_over_dsgd_grade_ratio": round(route_s / grade_s, 2), "full_marks": float(full)}


if __name__ == "__main__":
    print(measure(int(sys.argv[1]) if len(sys.argv) > 1 else 6))
