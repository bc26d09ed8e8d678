"""End-to-end grading: solutions score full marks, released stubs zero, cheats zero with a reason; kernels run."""

from __future__ import annotations

import csv
import os
import shutil
from pathlib import Path

import nbformat
import pytest

from dsgd_teach.grading import cli, release
from dsgd_teach.grading.batch import Limits, grade_batch
from dsgd_teach.grading.notebook import find_assignments

SOURCE = Path(__file__).resolve().parents[1] / "course" / "assignments" / "source"
PS01 = SOURCE / "ps01_sgd" / "ps01_sgd.ipynb"
FAST = Limits(timeout_s=8, memory_mb=1536, cpu_s=120)


def _cell(nb, grade_id: str):
    return next(c for c in nb.cells if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == grade_id)


def _variant(dest: Path, changes: dict[str, str]) -> None:
    """Write ps01's solution notebook with some cells' sources replaced ({grade_id: new source})."""
    nb = nbformat.read(str(PS01), as_version=4)
    for gid, src in changes.items():
        cell = _cell(nb, gid)
        cell.source = src.replace("{SOLUTION}", cell.source)
    dest.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(dest))


WRONG_Q1 = "def minibatch_indices(n, batch_size, step, seed):\n    return np.arange(min(n, batch_size))\n"
READ_HIDDEN = '''import os, glob, json, pathlib
import dsgd_teach
guesses = [pathlib.Path(dsgd_teach.__file__).resolve().parents[1] / "course/assignments/source/ps01_sgd/ps01_sgd.ipynb",
           pathlib.Path(os.readlink(f"/proc/{os.getppid()}/cwd")) / "ps01_sgd.ipynb" if os.path.exists(f"/proc/{os.getppid()}/cwd") else None]
try:
    guesses += [pathlib.Path(p) for p in glob.glob(os.path.expanduser("~") + "/../**/source/ps01_sgd/*.ipynb", recursive=True)]
except PermissionError:
    pass
stolen = None
for path in guesses:
    try:
        stolen = json.loads(open(path).read())
        break
    except Exception:
        pass
if stolen is not None:
    for cell in stolen["cells"]:
        if "def minibatch_indices" in "".join(cell["source"]):
            exec("".join(cell["source"]))
else:
''' + "    " + WRONG_Q1.replace("\n    ", "\n        ")
MONKEYPATCH = '''import dsgd_teach.grading.checks as checks, dsgd_teach.grading.values as values, dsgd_teach.grading.probe as probe
checks.check = lambda *a, **k: None
values.same = lambda *a, **k: True
probe.record = probe.reference = lambda *a, **k: None
_dsgd_record = lambda *a, **k: None
check = lambda *a, **k: None
ip = get_ipython()
_run = ip.run_cell
def run_cell(raw_cell, *args, **kwargs):
    result = _run(raw_cell, *args, **kwargs)
    result.error_in_exec = None
    return result
ip.run_cell = run_cell
''' + WRONG_Q1

CHEATS = {
    "edited_tests": ({"ps01_sgd_q1_solution": WRONG_Q1, "ps01_sgd_q1_tests": "pass",
                      "ps01_sgd_q2_tests": "assert True"}, {"q1": 0, "q2": 2}),
    "showtraceback": ({"ps01_sgd_q1_solution": "get_ipython().showtraceback = lambda *a, **k: None\n" + WRONG_Q1},
                      {"q1": 0, "q2": 2}),
    "sys_exit": ({"ps01_sgd_q1_solution": "import sys\nsys.exit()\n{SOLUTION}"}, {"q1": 0, "q2": 2}),
    "os_exit": ({"ps01_sgd_q2_solution": "import os\nos._exit(0)\n{SOLUTION}"}, {"q1": 2, "q2": 0, "q3": 0}),
    "kill_kernel": ({"ps01_sgd_q3_solution": "{SOLUTION}\nimport os, signal\nos.kill(os.getpid(), signal.SIGKILL)"},
                    {"q1": 2, "q2": 2, "q3": 0}),
    "infinite_loop": ({"ps01_sgd_q3_solution": "{SOLUTION}\nwhile True:\n    pass"}, {"q1": 2, "q2": 2, "q3": 0}),
    "memory_hog": ({"ps01_sgd_q1_solution": "hog = np.ones(4 * 2**30 // 8)\n{SOLUTION}"}, {"q1": 0, "q2": 2}),
    "read_hidden": ({"ps01_sgd_q1_solution": READ_HIDDEN}, {"q1": 0, "q2": 2}),
    "monkeypatch_helpers": ({"ps01_sgd_q1_solution": MONKEYPATCH}, {"q1": 0, "q2": 0, "q3": 0}),
}
REASONS = {"os_exit": "kernel died", "kill_kernel": "kernel died", "infinite_loop": "timeout",
           "memory_hog": "MemoryError", "sys_exit": "NameError"}


def _rows(out: Path) -> dict[tuple[str, str], dict[str, str]]:
    with open(out / "grades.csv") as fh:
        return {(r["student"], r["question"].replace("ps01_sgd_", "").replace("_tests", "")): r
                for r in csv.DictReader(fh)}


@pytest.mark.timeout(600)
def test_cheating_and_broken_submissions_score_zero_and_the_batch_completes(tmp_path):
    subs = tmp_path / "submissions"
    for good in ("good_1", "good_2"):
        _variant(subs / good / "ps01_sgd" / "ps01_sgd.ipynb", {})
    for name, (changes, _) in CHEATS.items():
        _variant(subs / name / "ps01_sgd.ipynb", changes)
    (subs / "corrupt").mkdir()
    (subs / "corrupt" / "ps01_sgd.ipynb").write_text("{not json")
    (subs / "absent").mkdir()
    out = tmp_path / "graded"
    rc = cli.main([str(subs), "--assignment", "ps01_sgd", "--out", str(out), "--source", str(SOURCE),
                   "--timeout", str(FAST.timeout_s), "--cpu-s", str(FAST.cpu_s), "--jobs", "2", "--no-progress"])
    assert rc == 0
    rows = _rows(out)
    for good in ("good_1", "good_2"):
        assert [rows[(good, q)]["points"] for q in ("q1", "q2", "q3")] == ["2.0"] * 3, rows[(good, "q1")]
        assert (good, "(integrity)") not in rows
    for name, (_, expected) in CHEATS.items():
        for q, points in expected.items():
            row = rows[(name, q)]
            assert float(row["points"]) == points, (name, q, row["reason"])
            if points == 0:
                assert row["reason"] and row["reason"] != "passed", (name, q)
        if name in REASONS:
            zero_q = next(q for q, p in expected.items() if p == 0)
            assert REASONS[name] in rows[(name, zero_q)]["reason"], (name, rows[(name, zero_q)]["reason"])
    flagged = rows[("read_hidden", "(integrity)")]["reason"]
    assert "FLAGGED" in flagged and "open" in flagged and "ps01_sgd.ipynb" in flagged, flagged
    assert "could not read" in rows[("corrupt", "q1")]["reason"]
    assert rows[("absent", "q1")]["reason"] == "no notebook submitted"
    assert (out / "feedback" / "ps01_sgd" / "good_1.html").read_text().count("passed") == 3
    assert "hidden check" not in (out / "feedback" / "ps01_sgd" / "good_1.html").read_text()


@pytest.fixture(scope="module")
def released(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("release")
    assert release.main(["--out", str(out), "--source", str(SOURCE)]) == 0
    return out


def test_release_removes_solutions_and_hidden_tests(released):
    names = sorted(find_assignments(SOURCE))
    assert len(names) == len(list(SOURCE.glob("ps*/ps*.ipynb"))) >= 8
    assert {"ps07_model_parallel", "ps08_averaging"} <= set(names)
    for name in names:
        text = (released / name / f"{name}.ipynb").read_text()
        assert "BEGIN HIDDEN TESTS" not in text and "BEGIN SOLUTION" not in text and "NotImplementedError" in text
        assert "_ref" not in text and "check(" in text


@pytest.mark.timeout(600)
def test_every_solution_scores_full_marks_and_every_stub_zero(released, tmp_path):
    subs = tmp_path / "submissions"
    for name, path in find_assignments(SOURCE).items():
        (subs / "solution").mkdir(parents=True, exist_ok=True)
        shutil.copy(path, subs / "solution" / f"{name}.ipynb")
        (subs / "stub" / name).mkdir(parents=True, exist_ok=True)
        shutil.copy(released / name / f"{name}.ipynb", subs / "stub" / name / f"{name}.ipynb")
    graded = grade_batch(subs, SOURCE, tmp_path / "out", limits=Limits(timeout_s=60, cpu_s=300), jobs=2,
                         progress=False, seed=int.from_bytes(os.urandom(3), "big"))
    assert len(graded) == 2 * len(find_assignments(SOURCE))
    for sub in graded:
        points = [g.points for g in sub.grades]
        if sub.student == "solution":
            assert points == [g.max_points for g in sub.grades] and len(points) >= 2, (sub.assignment, sub.grades)
        else:
            assert sum(points) == 0 and all("NotImplementedError" in g.reason for g in sub.grades), sub.grades
