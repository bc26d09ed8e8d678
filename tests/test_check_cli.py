"""`dsgd-teach check NOTEBOOK`: the visible checks, in the grader's sandbox, never a hidden test. The reference
solution passes; a notebook whose first answer is wrong fails that question with the visible check's own message
(label, expected, got, hint) and passes the others; no hidden-test line reaches the output. A released notebook
(nbgrader's generate_assignment) carries the note about `dsgd-teach check` and is checked alone, in an empty folder
with no assignment sources anywhere: its own locked test cells, as released."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import nbformat

from dsgd_teach.grading.notebook import HIDDEN_BEGIN, HIDDEN_END, rewrite_test
from dsgd_teach.grading.release import CHECK_NOTE, generate

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "course" / "assignments" / "source" / "ps01_sgd" / "ps01_sgd.ipynb"
WRONG_Q1 = ("import numpy as np\n"
            "def minibatch_indices(n, batch_size, step, seed):\n"
            "    return np.arange(min(n, batch_size))  # ignores the permutation\n")


def hidden_lines() -> list[str]:
    """The source's hidden-test lines, whitespace removed, that no visible line repeats (short ones skipped)."""
    hidden, shown, inside = [], set(), False
    for cell in json.loads(SOURCE.read_text())["cells"]:
        src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        for line in src.splitlines():
            if HIDDEN_BEGIN in line or HIDDEN_END in line:
                inside = HIDDEN_BEGIN in line
            elif len(re.sub(r"\s", "", line)) >= 16:
                (hidden.append if inside else shown.add)(re.sub(r"\s", "", line))
    assert len(hidden) > 20
    return [line for line in hidden if line not in shown]


def run_check(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["nice", "-n", "5", sys.executable, "-m", "dsgd_teach.cli", "check", str(path),
                           "--notebook-s", "240"], capture_output=True, text=True, timeout=600, cwd=REPO)


def test_visible_mode_cuts_the_hidden_block():
    nb = nbformat.read(str(SOURCE), as_version=4)
    test = next(c for c in nb.cells if HIDDEN_BEGIN in c.source)
    visible = rewrite_test(test.source, "visible")
    assert HIDDEN_BEGIN not in visible and "grader_seed" not in visible and "check(" in visible
    assert not [line for line in hidden_lines() if line in re.sub(r"\s", "", visible)]


def test_check_passes_the_reference_and_fails_a_wrong_answer(tmp_path):
    good = run_check(SOURCE)
    assert good.returncode == 0, good.stdout + good.stderr
    assert good.stdout.count("PASS") == 3 and "3 of 3 question(s) pass their visible checks" in good.stdout

    nb = nbformat.read(str(SOURCE), as_version=4)
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == "ps01_sgd_q1_solution":
            cell.source = WRONG_Q1
    path = tmp_path / "ps01_sgd.ipynb"
    nbformat.write(nb, str(path))
    bad = run_check(path)
    out = bad.stdout + bad.stderr
    assert bad.returncode == 1, out
    assert "FAIL  ps01_sgd_q1_tests" in out and "PASS  ps01_sgd_q2_tests" in out and "PASS  ps01_sgd_q3_tests" in out
    assert "minibatch_indices(10, 4, step=0, seed=7)" in out and "expected" in out and "got" in out
    assert "hint: step 0 is the first batch_size entries of epoch 0's permutation" in out
    squashed = re.sub(r"\s", "", out + good.stdout)
    assert not [line for line in hidden_lines() if line in squashed]
    assert "hidden check" not in out


# `dsgd-teach check` in a process that finds no assignment sources (neither in the cwd nor beside the package).
NO_SOURCES = ("import sys\nimport dsgd_teach.grading.paths as paths\npaths.default_source_dir = lambda: None\n"
              "from dsgd_teach.grading.check_cli import main\nsys.exit(main(sys.argv[1:]))\n")


def _solution(grade_id: str) -> str:
    cell = next(c for c in nbformat.read(str(SOURCE), as_version=4).cells
                if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)
    return re.sub(r"^\s*### (BEGIN|END) SOLUTION\n", "", cell.source, flags=re.M)


def test_a_released_notebook_is_checked_alone(tmp_path):
    released = generate(SOURCE.parent.parent, tmp_path / "release", ["ps01_sgd"])[0]
    nb = nbformat.read(str(released), as_version=4)
    assert nb.cells[1].source == CHECK_NOTE.format(name="ps01_sgd.ipynb") and "--source" in nb.cells[1].source
    # The student's copy: Q1 wrong, Q2 answered, Q3 still the released stub (raise NotImplementedError()).
    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid == "ps01_sgd_q1_solution":
            cell.source = WRONG_Q1
        elif gid == "ps01_sgd_q2_solution":
            cell.source = _solution(gid)
        elif gid == "ps01_sgd_q3_solution":
            assert "NotImplementedError" in cell.source
    alone = tmp_path / "empty"
    alone.mkdir()
    nbformat.write(nb, str(alone / "ps01_sgd.ipynb"))
    assert [p.name for p in alone.iterdir()] == ["ps01_sgd.ipynb"]
    run = subprocess.run(["nice", "-n", "5", sys.executable, "-c", NO_SOURCES, "ps01_sgd.ipynb", "--notebook-s",
                          "240"], capture_output=True, text=True, timeout=600, cwd=alone)
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    assert "FAIL  ps01_sgd_q1_tests" in out and "PASS  ps01_sgd_q2_tests" in out and "FAIL  ps01_sgd_q3_tests" in out
    assert "minibatch_indices(10, 4, step=0, seed=7)" in out and "expected" in out and "got" in out
    assert "hint: step 0 is the first batch_size entries of epoch 0's permutation" in out
    assert "NotImplementedError" in out and "still the released stub" in out
    assert not [line for line in hidden_lines() if line in re.sub(r"\s", "", out)]

    # A locked test cell edited after its release (here: to pass whatever) fails its question, saying so.
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == "ps01_sgd_q1_tests":
            cell.source = "pass\n"
    nbformat.write(nb, str(alone / "ps01_sgd.ipynb"))
    run = subprocess.run(["nice", "-n", "5", sys.executable, "-c", NO_SOURCES, "ps01_sgd.ipynb", "--notebook-s",
                          "240"], capture_output=True, text=True, timeout=600, cwd=alone)
    assert run.returncode == 1 and "FAIL  ps01_sgd_q1_tests" in run.stdout, run.stdout + run.stderr
    assert "was edited after its release" in run.stdout and "PASS  ps01_sgd_q2_tests" in run.stdout
