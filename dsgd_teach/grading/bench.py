"""Time grading a class: 30 submissions of one assignment (solutions, stubs and wrong answers), sequentially.

Run: python -m dsgd_teach.grading.bench [N] [ASSIGNMENT] [JOBS] [--unsafe-no-sandbox]. Kernel start-up dominates, so the figure scales
with the machine's load; `per_notebook_s` is the number to compare. `--overhead=ROUNDS` grades the same N
submissions sandboxed and unsandboxed in alternating rounds and reports the medians and the sandbox's overhead.
"""

from __future__ import annotations

import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import nbformat

from .batch import Limits, grade_batch
from .notebook import find_assignments, nbgrader_meta
from .paths import default_source_dir

_SOLUTION = re.compile(r"### BEGIN SOLUTION.*?### END SOLUTION", re.S)


def _variant(nb_path: Path, kind: str, dest: Path) -> None:
    """A submission: the solution ("good"), stubs like nbgrader's ("stub"), or answers returning None ("wrong")."""
    nb = nbformat.read(str(nb_path), as_version=4)
    for cell in nb.cells:
        if nbgrader_meta(cell).get("solution") and kind != "good":
            body = "raise NotImplementedError()" if kind == "stub" else "return None"
            cell.source = _SOLUTION.sub(body, cell.source)
    dest.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(dest))


def measure(n: int = 30, assignment: str = "ps01_sgd", jobs: int = 1, sandbox: bool = True) -> dict[str, float]:
    """Grade n submissions (2/3 good, 1/6 stubs, 1/6 wrong) and report wall-clock figures."""
    source = default_source_dir()
    if source is None:
        raise RuntimeError("course/assignments/source not found")
    nb_path = find_assignments(source)[assignment]
    with tempfile.TemporaryDirectory(prefix="dsgd-grade-bench-") as tmp:
        subs = Path(tmp) / "subs"
        for i in range(n):
            kind = "good" if i % 6 < 4 else ("stub" if i % 6 == 4 else "wrong")
            _variant(nb_path, kind, subs / f"student{i:03d}_{kind}" / f"{assignment}.ipynb")
        t0 = time.perf_counter()
        graded = grade_batch(subs, source, Path(tmp) / "out", assignment=assignment, limits=Limits(), jobs=jobs,
                             seed=1, progress=False, sandbox=sandbox)
        wall = time.perf_counter() - t0
    full = sum(all(g.points == g.max_points for g in s.grades) for s in graded)
    return {"submissions": float(n), "jobs": float(jobs), "grade_batch_s": round(wall, 1),
            "per_notebook_s": round(wall / (n + 1), 2), "full_marks": float(full)}


def overhead(rounds: int = 5, n: int = 3, assignment: str = "ps01_sgd") -> dict[str, object]:
    """Per-notebook seconds sandboxed and not, in alternating rounds (so load drifts hit both): medians, overhead."""
    times: dict[bool, list[float]] = {True: [], False: []}
    for k in range(rounds):
        for sandbox in ((True, False) if k % 2 == 0 else (False, True)):
            times[sandbox].append(measure(n, assignment, 1, sandbox)["per_notebook_s"])
    boxed, bare = statistics.median(times[True]), statistics.median(times[False])
    return {"rounds": float(rounds), "sandboxed_s": boxed, "unsandboxed_s": bare,
            "overhead_pct": round(100 * (boxed - bare) / bare, 1), "sandboxed_all": times[True],
            "unsandboxed_all": times[False]}


if __name__ == "__main__":
    flags = [a for a in sys.argv[1:] if a.startswith("--")]
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    rounds = [int(a.split("=", 1)[1]) for a in flags if a.startswith("--overhead=")]
    if rounds:
        print(overhead(rounds[0], int(args[0]) if args else 3, args[1] if len(args) > 1 else "ps01_sgd"))
        sys.exit(0)
    print(measure(int(args[0]) if args else 30, args[1] if len(args) > 1 else "ps01_sgd",
                  int(args[2]) if len(args) > 2 else 1, sandbox="--unsafe-no-sandbox" not in flags))
