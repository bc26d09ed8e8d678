"""The nbgrader route graded next to honest students: no submission stops the run or costs the grader its memory.

One `nbgrader autograde` grades ps01 for honest students placed before, among and after submissions of the classes
of issue 45: a parse bomb (4.2 million empty objects in one cell's metadata), nbgrader metadata of a newer schema
version, an honest student who pasted a test cell twice, the plain route's metadata chaos, a student who kills its
own grading worker and one whose worker overruns. The run must exit 0, grade every student, give the honest ones
full marks, give the attackers what they answered honestly, and the grader's own peak RSS (nbgrader's process)
must stay under GRADER_PEAK_MB.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from grading_attacks import HONEST_POINTS, REASONS, write_submission
from nbgrader.api import Gradebook

from dsgd_teach.grading import bubblewrap
from dsgd_teach.grading.nbg.batches import BATCH_LOG, read_batches
from dsgd_teach.grading.nbg.course import make_course, nbgrader
from dsgd_teach.grading.paths import default_source_dir

COURSE, A = "dsgd", "ps01_sgd"
STUDENTS = {"a_honest": "good", "b_duplicate_test": "duplicate_test", "c_kill_own_worker": "kill_own_worker",
            "d_honest": "good", "e_metadata_chaos": "metadata_chaos", "f_newer_schema": "newer_schema",
            "g_overrun": "overrun", "h_parse_bomb": "parse_bomb", "z_honest": "good"}
NOTEBOOK_S, KILL_GRACE_S = 35, 15
GRADER_PEAK_MB = 400  # nbgrader's own process, start-up included (a parse bomb read in it peaked at 2.2 GB)
PEAK = re.compile(r"DSGD_PEAK_RSS_KB (\d+)")
# VmHWM, not getrusage's ru_maxrss: Linux keeps ru_maxrss across exec, so it reported the forking pytest worker's
# own peak (694 MB in a full run) instead of nbgrader's.
MEASURED = ("import atexit, re, sys\n"
            "atexit.register(lambda: print('DSGD_PEAK_RSS_KB', re.search(r'VmHWM:\\s+(\\d+)', "
            "open('/proc/self/status').read()).group(1), file=sys.stderr))\n"
            "sys.argv = ['nbgrader'] + sys.argv[1:]\n"
            "from nbgrader.apps.nbgraderapp import main\nmain()\n")
pytestmark = [pytest.mark.timeout(1500),
              pytest.mark.skipif(bool(bubblewrap.probe()), reason=f"no OS sandbox here: {bubblewrap.probe()}")]


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> dict:
    """A ps01 course with the class submitted, autograded once; the run's output, its peak RSS and the scores."""
    root = tmp_path_factory.mktemp("nbgrader-hostile") / "course"
    make_course(root, COURSE, None, [A])
    proc = nbgrader(root, "generate_assignment", A, "--force")
    assert proc.returncode == 0, proc.stderr[-3000:]
    source = default_source_dir() / A / f"{A}.ipynb"
    for student, kind in STUDENTS.items():
        write_submission(source, root / "submitted" / student / A / f"{A}.ipynb", kind)
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    run = subprocess.run([sys.executable, "-c", MEASURED, "autograde", A, "--force",
                          f"--DsgdGrade.notebook_s={NOTEBOOK_S}", f"--DsgdGrade.kill_grace_s={KILL_GRACE_S}",
                          "--DsgdGrade.timeout_s=20", "--DsgdGrade.cpu_s=120"],
                         cwd=root, env=env, capture_output=True, text=True, timeout=1400)
    scores = {}
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}", COURSE) as gb:
        for sub in gb.assignment_submissions(A):
            grades = sorted(sub.notebooks[0].grades, key=lambda g: g.name)
            scores[sub.student.id] = [g.auto_score for g in grades]
    peak = PEAK.search(run.stderr)
    return {"root": root, "run": run, "scores": scores, "peak_kb": int(peak.group(1)) if peak else None}


def _verdicts(root: Path, student: str) -> str:
    """Every verdict the route wrote into the student's autograded test cells, as one text."""
    nb = nbformat.read(str(root / "autograded" / student / A / f"{A}.ipynb"), as_version=4)
    return " ".join(str(o.get("evalue", "")) + str(o.get("text", "")) for c in nb.cells for o in c.get("outputs", []))


def test_the_run_grades_every_student_and_honest_ones_keep_full_marks(graded):
    run = graded["run"]
    assert run.returncode == 0, f"exit {run.returncode}\n{run.stderr[-6000:]}"
    for student, kind in STUDENTS.items():
        allowed = HONEST_POINTS.get(kind, {}) if kind != "good" else {"q1": 2.0, "q2": 2.0, "q3": 2.0}
        expected = [allowed.get(q, 0.0) for q in ("q1", "q2", "q3")]
        assert graded["scores"].get(student) == expected, (student, graded["scores"].get(student), run.stderr[-3000:])


def test_each_attack_is_its_own_failure_with_its_reason(graded):
    root = graded["root"]
    for student, kind in STUDENTS.items():
        if kind in REASONS:
            assert REASONS[kind] in _verdicts(root, student), (student, _verdicts(root, student)[:600])
    notes = {e["student"]: " ".join(e.get("notes", [])) for b in read_batches(root / BATCH_LOG).values()
             for e in b["notebooks"]}
    assert "schema version 4" in notes["f_newer_schema"], notes
    assert "a second copy of the cell" in notes["b_duplicate_test"], notes
    assert "schema version" in notes["e_metadata_chaos"] and "planted" not in notes["e_metadata_chaos"], notes
    flags = {e["student"]: e["flags"] for b in read_batches(root / BATCH_LOG).values() for e in b["notebooks"]}
    assert not any(flags.values()), flags  # no denied action was observed: nothing is flagged


def test_the_graders_own_peak_memory_stays_bounded_beside_a_parse_bomb(graded):
    assert graded["peak_kb"], graded["run"].stderr[-2000:]
    print(f"nbgrader autograde's peak RSS: {graded['peak_kb'] // 1024} MB")
    assert graded["peak_kb"] < GRADER_PEAK_MB * 1024, f"nbgrader's process peaked at {graded['peak_kb'] // 1024} MB"
