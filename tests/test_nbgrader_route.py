"""A real nbgrader course, end to end, graded through dsgd-teach: honest, stub, half-done and cheating students.

Instructor steps run as `nbgrader` commands in a temporary course directory (generate_assignment, release, collect,
autograde, generate_feedback, release_feedback, export); student steps (fetch, submit, fetch_feedback) go through
nbgrader's exchange classes in-process, as the JupyterHub Assignments tab does. formgrader is then started on
127.0.0.1 with a random token and must serve the same scores.
"""

from __future__ import annotations

import csv
import json
import os
import re
import secrets
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import nbformat
import psutil
import pytest
from nbgrader.api import Gradebook
from nbgrader.auth import Authenticator
from nbgrader.coursedir import CourseDirectory
from nbgrader.exchange.default import ExchangeFetchAssignment, ExchangeFetchFeedback, ExchangeSubmit
from traitlets.config import Config

from dsgd_teach.grading.nbg.batches import BATCH_LOG, read_batches
from dsgd_teach.grading.nbg.course import make_course, nbgrader
from dsgd_teach.grading.notebook import find_assignments, nbgrader_meta
from dsgd_teach.grading.paths import default_source_dir

ASSIGNMENTS = ("ps04_syncasync", "ps05_collectives")
COURSE = "dsgd"
pytestmark = pytest.mark.timeout(1200)  # the module's course fixture grades 14 notebooks in ~14 nbgrader commands
_SOLUTION = re.compile(r"[ \t]*### (BEGIN|END) SOLUTION\n?")

# Wrong but well-formed answers: they run to the end of every test cell, so only the checks can catch them.
WRONG = {
    "ps04_syncasync_q1_solution": "def backup_aggregate(arrivals, n_needed):\n    return np.zeros(2), [], []\n",
    "ps04_syncasync_q2_solution": ("def async_apply(w0, updates, base_lr):\n"
                                   "    return np.array(w0, dtype=float), [0] * len(updates)\n\n"
                                   "def async_sgd(w0, grad_fn, compute_times, n_updates, base_lr):\n"
                                   "    return np.array(w0, dtype=float), [(0, 0)] * n_updates\n"),
    "ps05_collectives_q1_solution": ("def ring_schedule(N):\n"
                                     "    return [[(r, (r + 1) % N, r) for r in range(N)] for t in range(2 * (N - 1))]\n"),
    "ps05_collectives_q2_solution": ("def ring_allreduce(arrays, log=None):\n"
                                     "    return [np.asarray(a, dtype=float).copy() for a in arrays]\n\n"
                                     "def ring_bytes_sent(log, K, N, itemsize):\n    return [K * itemsize] * N\n"),
}
REDEFINE = "def check(*args, **kwargs):\n    pass\n"
PATCH_MODULE = """import dsgd_teach.grading.checks as _checks, dsgd_teach.grading.values as _values
_checks.check.__code__ = (lambda *args, **kwargs: None).__code__
_values.same.__code__ = (lambda *args, **kwargs: True).__code__
"""
BLANK_LATER_CELLS = "get_ipython().input_transformers_post.append(lambda lines: [])\n"
# A child process started through an unaudited call reads the source notebook (its folder is named on the kernel's
# command line) and the parent runs the stolen solution cells.
CHILD_THEFT = '''import os, sys, json, glob, _posixsubprocess
_child = """
import os, json, glob
args = open("/proc/%d/cmdline" % os.getppid(), "rb").read().decode(errors="replace").split("\\\\0")
roots = [p for a in args if a.startswith("[") for p in json.loads(a)]
for root in roots:
    for path in glob.glob(root + "/**/source/{assignment}/*.ipynb", recursive=True):
        open("stolen.json", "w").write(open(path).read())
"""
try:
    _r, _w = os.pipe()
    _pid = _posixsubprocess.fork_exec([sys.executable.encode(), b"-c", _child.encode()], [sys.executable.encode()],
                                      True, (_w,), None, None, -1, -1, -1, -1, -1, -1, _r, _w, True, False, -1,
                                      None, None, -1, -1, None, False)
    os.close(_w)
    os.waitpid(_pid, 0)
except Exception:
    pass
if os.path.exists("stolen.json"):
    for _cell in json.load(open("stolen.json"))["cells"]:
        if (_cell.get("metadata", {{}}).get("nbgrader", {{}}).get("solution")):
            exec("".join(_cell["source"]))
'''
STUDENTS = ("honest", "stub", "half", "redefine_check", "patch_module", "blank_cells", "child_theft")
# Points per question (q1, q2) out of 3 + 3 in both assignments.
EXPECTED = {"honest": (3, 3), "stub": (0, 0), "half": (3, 0), "redefine_check": (3, 0), "patch_module": (0, 0),
            "blank_cells": (0, 0), "child_theft": (0, 0)}


def _ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, f"{proc.args}: exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return proc


def _exchange(cls, exchange: Path, home: Path, assignment: str, student: str | None = None) -> None:
    """A student-side exchange step, as the Assignments tab of the student's Jupyter server runs it."""
    c = Config()
    c.CourseDirectory.course_id = COURSE
    c.CourseDirectory.assignment_id = assignment
    if student:
        c.CourseDirectory.student_id = student
    c.Exchange.root = str(exchange)
    c.Exchange.assignment_dir = str(home)
    c.Exchange.cache = str(home / ".nbgrader-cache")
    cls(coursedir=CourseDirectory(config=c), authenticator=Authenticator(config=c), config=c).start()


def _answer(fetched: Path, source: Path, student: str, assignment: str) -> None:
    """The student's work on the fetched notebook: honest answers, stubs, wrong answers and cheats."""
    nb = nbformat.read(str(fetched), as_version=4)
    solutions = {nbgrader_meta(c).get("grade_id"): _SOLUTION.sub("", c.source)
                 for c in nbformat.read(str(source), as_version=4).cells if nbgrader_meta(c).get("solution")}
    for cell in nb.cells:
        gid = nbgrader_meta(cell).get("grade_id", "")
        if not nbgrader_meta(cell).get("solution"):
            continue
        first = gid.endswith("_q1_solution")
        honest, wrong = solutions[gid], WRONG[gid]
        cell.source = {
            "honest": honest,
            "stub": cell.source,
            "half": honest if first else cell.source,
            "redefine_check": honest if first else REDEFINE + wrong,
            "patch_module": (PATCH_MODULE if first else "") + wrong,
            "blank_cells": (BLANK_LATER_CELLS if first else "") + wrong,
            "child_theft": wrong + ("\n" + CHILD_THEFT.format(assignment=assignment) if first else ""),
        }[student]
    nbformat.write(nb, str(fetched))


@pytest.fixture(scope="module")
def course(tmp_path_factory) -> dict:
    """Build, release, hand in, collect and grade the class; returns paths and the commands' outputs."""
    tmp = tmp_path_factory.mktemp("nbgrader-course")
    root, exchange = tmp / "course", tmp / "exchange"
    make_course(root, COURSE, exchange, list(ASSIGNMENTS))
    _ok(nbgrader(root, "generate_assignment", "*", "--force"))
    for a in ASSIGNMENTS:
        _ok(nbgrader(root, "release_assignment", a))
    sources = find_assignments(default_source_dir())
    for student in STUDENTS:
        home = tmp / "home" / student
        for a in ASSIGNMENTS:
            _exchange(ExchangeFetchAssignment, exchange, home, a)
            _answer(home / a / f"{a}.ipynb", sources[a], student, a)
            _exchange(ExchangeSubmit, exchange, home, a, student)
    for a in ASSIGNMENTS:
        _ok(nbgrader(root, "collect", a))
    failures = {"no_package": _broken_environment(root, tmp), "dead_kernel": nbgrader(
        root, "autograde", ASSIGNMENTS[1], "--student", "honest", "--force", "--DsgdGrade.memory_mb=40")}
    a = ASSIGNMENTS[1]
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}", COURSE) as gb:  # what the failed batches left
        failures["auto_scores"] = [g.auto_score for g in gb.find_submission_notebook(a, a, "honest").grades]
    failures["autograded"] = (root / "autograded" / "honest" / a).exists()
    graded = _ok(nbgrader(root, "autograde", "*", "--force"))
    return {"root": root, "exchange": exchange, "tmp": tmp, "failures": failures, "autograde": graded}


def _broken_environment(root: Path, tmp: Path) -> subprocess.CompletedProcess:
    """autograde where dsgd_teach cannot be imported (a package of that name that fails on import shadows it)."""
    shadow = tmp / "shadow" / "dsgd_teach"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('dsgd_teach is not installed here (simulated)')\n")
    return nbgrader(root, "autograde", ASSIGNMENTS[1], "--student", "honest", "--force",
                    env={"PYTHONPATH": str(shadow.parent)})


def _scores(root: Path) -> dict[tuple[str, str], list[float]]:
    """{(student, assignment): [points per question in order]} from nbgrader's gradebook."""
    out = {}
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}", COURSE) as gb:
        for a in ASSIGNMENTS:
            for sub in gb.assignment_submissions(a):
                nb = sub.notebooks[0]
                grades = sorted(nb.grades, key=lambda g: g.name)
                out[(sub.student.id, a)] = [g.score for g in grades]
    return out


def test_honest_stub_half_and_cheats_get_their_points_in_the_gradebook(course):
    scores = _scores(course["root"])
    for student, expected in EXPECTED.items():
        for a in ASSIGNMENTS:
            assert tuple(scores[(student, a)]) == expected, (student, a, scores[(student, a)])
    with Gradebook(f"sqlite:///{course['root'] / 'gradebook.db'}", COURSE) as gb:
        a = ASSIGNMENTS[1]
        comment = gb.find_comment(f"{a}_q2_solution", a, a, "half").auto_comment
        assert comment.startswith(f"{a}_q2_tests: 0 / 3 points:") and "NotImplementedError" in comment, comment
        assert gb.find_comment(f"{a}_q1_solution", a, a, "half").auto_comment.endswith("3 / 3 points: passed")


def test_solutions_stolen_through_a_child_process_score_zero(course):
    scores = _scores(course["root"])
    for a in ASSIGNMENTS:
        assert tuple(scores[("child_theft", a)]) == EXPECTED["child_theft"], scores[("child_theft", a)]


def test_a_grading_environment_without_the_package_or_a_kernel_fails_loudly(course):
    no_package, dead_kernel = course["failures"]["no_package"], course["failures"]["dead_kernel"]
    assert no_package.returncode != 0 and "dsgd_teach is not installed here" in no_package.stderr
    assert dead_kernel.returncode != 0
    assert "GradingEnvironmentError" in dead_kernel.stderr and "reference run" in dead_kernel.stderr
    assert "never ran a cell" in dead_kernel.stderr or "failed" in dead_kernel.stderr
    failures = course["failures"]
    assert failures["auto_scores"] and all(score is None for score in failures["auto_scores"]), failures
    assert not failures["autograded"]


def test_feedback_shows_hidden_checks_in_words_only_and_reaches_the_student(course):
    root, tmp = course["root"], course["tmp"]
    _ok(nbgrader(root, "generate_feedback", "*", "--force"))
    pages = sorted((root / "feedback").rglob("*.html"))
    assert len(pages) == len(STUDENTS) * len(ASSIGNMENTS)
    for page in pages:
        text = page.read_text()
        assert "BEGIN HIDDEN TESTS" not in text and "_ref" not in text, page
        assert "hidden checks (" in text and "expects" in text, page
    half = (root / "feedback" / "half" / ASSIGNMENTS[1] / f"{ASSIGNMENTS[1]}.html").read_text()
    assert "not reached" in half and "-&gt; passed" in half
    _ok(nbgrader(root, "release_feedback", ASSIGNMENTS[1]))
    home = tmp / "home" / "honest"
    _exchange(ExchangeFetchFeedback, course["exchange"], home, ASSIGNMENTS[1], "honest")
    fetched = list((home / ASSIGNMENTS[1] / "feedback").rglob("*.html"))
    assert fetched and "_ref" not in fetched[0].read_text()


def test_every_batch_has_its_own_recorded_seed_and_a_regrade_with_it_reproduces(course):
    root = course["root"]
    first = read_batches(root / BATCH_LOG)
    assert len(first) == 1 and len(next(iter(first.values()))["notebooks"]) == len(STUDENTS) * len(ASSIGNMENTS)
    seed = next(iter(first.values()))["seed"]
    before = _scores(root)
    _ok(nbgrader(root, "autograde", ASSIGNMENTS[0], "--student", "half", "--force"))
    _ok(nbgrader(root, "autograde", ASSIGNMENTS[0], "--student", "half", "--force", f"--DsgdGrade.seed={seed}"))
    batches = list(read_batches(root / BATCH_LOG).values())
    assert len(batches) == 3
    assert batches[1]["seed"] != seed and batches[2]["seed"] == seed
    assert _scores(root) == before


def test_export_and_formgrader_serve_the_gradebook_scores(course):
    root = course["root"]
    _ok(nbgrader(root, "export"))
    with open(root / "grades.csv") as fh:
        exported = {(r["student_id"], r["assignment"]): float(r["score"]) for r in csv.DictReader(fh)}
    totals = {key: sum(points) for key, points in _scores(root).items()}
    assert exported == totals
    assert exported[("honest", ASSIGNMENTS[0])] == 6 and exported[("half", ASSIGNMENTS[1])] == 3
    served = _formgrader_scores(root)
    assert served == totals


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _formgrader_scores(root: Path) -> dict[tuple[str, str], float]:
    """Start formgrader on 127.0.0.1 with a random token, read every submission's score, stop it."""
    port, token = _free_port(), secrets.token_hex(16)
    runtime = root.parent / "jupyter-runtime"
    cmd = [sys.executable, "-m", "jupyter", "server", "--no-browser", "--ServerApp.ip=127.0.0.1",
           f"--ServerApp.port={port}", "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
           f"--ServerApp.root_dir={root}", "--allow-root"]
    env = {"JUPYTER_RUNTIME_DIR": str(runtime), "PATH": str(Path(sys.executable).parent)}
    server = subprocess.Popen(cmd, cwd=root, env={**os.environ, **env}, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, start_new_session=True)
    base = f"http://127.0.0.1:{port}/formgrader/api"
    try:
        _wait_for(base + "/status", token, server)
        try:  # without the token: sent to the login page or refused, never the scores
            with urllib.request.urlopen(base + f"/submissions/{ASSIGNMENTS[0]}", timeout=30) as anonymous:
                assert "/login" in anonymous.geturl(), anonymous.geturl()
        except urllib.error.HTTPError as denied:
            assert denied.code in (401, 403), denied.code
        served = {}
        for a in ASSIGNMENTS:
            for sub in _get(base + f"/submissions/{a}", token):
                served[(sub["student"], a)] = float(sub["score"])
        a = ASSIGNMENTS[-1]
        first = _get(base + f"/submitted_notebooks/{a}/{a}", token)[0]
        page = _get(f"http://127.0.0.1:{port}/formgrader/submissions/{first['id']}/", token, raw=True)
        assert "0 / 3 points:" in page or "3 / 3 points: passed" in page, "manual-grading page lacks the verdicts"
        return served
    finally:
        _stop(server, port)


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _get(url: str, token: str, raw: bool = False):
    req = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        body = resp.read()
    return body.decode() if raw else json.loads(body)


def _wait_for(url: str, token: str, server: subprocess.Popen, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"formgrader exited {server.returncode}: {server.stderr.read().decode()[-3000:]}")
        try:
            if _get(url, token).get("status"):
                return
        except (urllib.error.URLError, ConnectionError, json.JSONDecodeError):
            time.sleep(0.5)
    raise TimeoutError(f"formgrader did not answer {url} within {timeout_s} s")


def _stop(server: subprocess.Popen, port: int) -> None:
    """Stop the server and everything it started; then nothing of it may remain and its port must be closed."""
    try:
        members = [server.pid] + [p.pid for p in psutil.Process(server.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        members = [server.pid]
    server.terminate()
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait(timeout=30)
    server.stderr.close()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(_running(p) for p in members):
        time.sleep(0.2)
    alive = [p for p in members if _running(p)]
    assert not alive, f"formgrader left processes behind: {alive}"
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0, "formgrader's port is still open"
