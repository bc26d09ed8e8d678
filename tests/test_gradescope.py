"""Gradescope's route and container mode, with namespaces denied for real (tests/docker_seccomp.py denies unshare,
setns, mount and namespace clones as Docker's default profile does): the zip built by `dsgd-teach gradescope`,
unpacked into an empty /autograder-shaped folder, its setup.sh run (with this machine's Python instead of apt and
a virtualenv; its self-test grades the reference once, and fails on a notebook the image cannot run) and
run_autograder run for the reference solution (late, with an extension), the released stub, an attacker and a
flagged attacker; results.json checked against Gradescope's specification, with no hidden-test text in any field;
container mode switched off refuses; the resubmission limit reports the last score; and a local `dsgd-teach grade
--container-mode` batch (stub, CONTAINER_ATTACKS with their honest points, deadlines and extensions) under the same
denial. Without root: every assignment's requirements.txt covers its imports, and find_notebook's choice.
"""

from __future__ import annotations

import csv
import importlib.metadata
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import jsonschema
import nbformat
import pytest

from dsgd_teach.grading.gradescope import find_notebook, over_limit
from dsgd_teach.grading.gradescope_cli import TORCH_CPU_INDEX, build, requirements
from dsgd_teach.grading.notebook import HIDDEN_BEGIN, HIDDEN_END

sys.path.insert(0, str(Path(__file__).parent))
from grading_attacks import FLAGGED, HONEST_POINTS, MARKER, write_submission  # noqa: E402

# The hostile class's attacks graded in container mode (tests/test_grading_hostile.py grades all of them under
# bubblewrap): those that container mode's missing PID, mount and network namespaces could let through (reading
# /proc and the batch's folders from a child, killing a neighbour's processes, detaching, planting files), a flagged
# one, one with honest points, and the user-namespace, memfd and keyring escapes. Left out for time: budget,
# watch_spin, overrun and kill_own_worker each wait out a time limit, and so does forged_reports here (its writes to
# every descriptor stall its run until --notebook-s, 180 s with the grace, then it scores 0); the notebook-level
# ones (parse_bomb, newer_schema, duplicate_test, metadata_chaos, malformed_reports, flood_after_denial,
# monkeypatch_thread) are decided before or after any sandbox runs, the same in every mode.
CONTAINER_ATTACKS = ("theft_child", "read_proc", "kill_pids", "detached", "plant", "echo_hidden", "flood", "memory",
                     "keyring")

REPO = Path(__file__).resolve().parents[1]
SOURCES = REPO / "course" / "assignments" / "source"
SOURCE = SOURCES / "ps01_sgd" / "ps01_sgd.ipynb"
DENY = [sys.executable, str(REPO / "tests" / "docker_seccomp.py")]
SYSTEM_PY = Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")
needs_root = pytest.mark.skipif(os.geteuid() != 0 or platform.machine() != "x86_64" or not SYSTEM_PY.exists()
                                or shutil.which("setpriv") is None,
                                reason="needs root, x86-64, setpriv and a system Python of this version")

# Gradescope's results.json (https://gradescope-autograders.readthedocs.io/en/latest/specs/), as a JSON schema.
VISIBILITY = {"enum": ["hidden", "after_due_date", "after_published", "visible"]}
FORMAT = {"enum": ["text", "html", "simple_format", "md", "ansi"]}
TEST = {"type": "object", "additionalProperties": False, "properties": {
    "score": {"type": "number"}, "max_score": {"type": "number"}, "status": {"enum": ["passed", "failed"]},
    "name": {"type": "string"}, "name_format": FORMAT, "number": {"type": "string"}, "output": {"type": "string"},
    "output_format": FORMAT, "tags": {"type": "array", "items": {"type": "string"}}, "visibility": VISIBILITY,
    "extra_data": {"type": "object"}}}
RESULTS = {"type": "object", "additionalProperties": False, "properties": {
    "score": {"type": "number"}, "execution_time": {"type": "integer", "minimum": 0}, "output": {"type": "string"},
    "output_format": FORMAT, "test_output_format": FORMAT, "test_name_format": FORMAT, "visibility": VISIBILITY,
    "stdout_visibility": VISIBILITY, "extra_data": {"type": "object"}, "tests": {"type": "array", "items": TEST},
    "leaderboard": {"type": "array"}},
    "anyOf": [{"required": ["score"]}, {"required": ["tests"], "properties": {
        "tests": {"items": {"required": ["score"]}}}}]}
DUE = "2026-12-01T23:59:00+00:00"


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


def assert_valid(doc: dict) -> None:
    """Schema-valid, and no hidden-test line in any text of the document."""
    jsonschema.validate(doc, RESULTS)
    squashed = re.sub(r"\s", "", json.dumps(doc, ensure_ascii=False).replace("\\n", " "))
    leaked = [line for line in hidden_lines() if line in squashed]
    assert not leaked, leaked


IMPORT = re.compile(r"^[ \t]*(?:from[ \t]+([A-Za-z_][\w.]*)[ \t]+import|import[ \t]+([A-Za-z_][\w.]*))", re.M)


def _loaded_by(module: str) -> set[str]:
    """The distributions whose modules importing `module` loads, seen from a fresh interpreter."""
    out = subprocess.run([sys.executable, "-c", f"import sys, json, {module}; print(json.dumps(sorted(sys.modules)))"],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    owners = importlib.metadata.packages_distributions()
    return {d.lower() for m in json.loads(out) for d in owners.get(m.split(".")[0], ())} - {"dsgd-teach"}


def test_requirements_cover_every_import_of_every_assignment(tmp_path):
    """Every assignment's requirements.txt pins the distribution of each module its code cells import (read from
    the cells, not the notebook's JSON, where no line starts with `import`), what the course's modules it imports
    load in turn (ps11's runtime: torch), and torch as the CPU build from PyTorch's CPU index (the kernel
    pre-imports torch and the runtime). ps13's zip names torch."""
    owners = importlib.metadata.packages_distributions()
    loaded: dict[str, set[str]] = {}
    for path in sorted(SOURCES.glob("*/*.ipynb")):
        lines = requirements(nbformat.read(str(path), as_version=4))
        pinned = {line.split("==")[0].lower() for line in lines if "==" in line}
        assert f"--extra-index-url {TORCH_CPU_INDEX}" in lines and any(re.fullmatch(r"torch==[\d.]+\+cpu", line)
                                                                         for line in lines), (path.name, lines)
        code = "\n".join(c.source for c in nbformat.read(str(path), as_version=4).cells if c.cell_type == "code")
        for m in IMPORT.finditer(code):
            module = m.group(1) or m.group(2)
            top = module.split(".")[0]
            if top in sys.stdlib_module_names:
                continue
            if top == "dsgd_teach":
                need = loaded.setdefault(module, _loaded_by(module))
            else:
                need = {d.lower() for d in owners[top]}
            assert need <= pinned, (path.name, module, need - pinned)
    for name in ("ps11_ring_comm", "ps13_transformer"):
        build(name, SOURCES, tmp_path / f"{name}.zip", {})
        with zipfile.ZipFile(tmp_path / f"{name}.zip") as zf:
            text = zf.read("requirements.txt").decode()
        assert re.search(r"^torch==[\d.]+\+cpu$", text, re.M) and re.search(r"^numpy==", text, re.M), text


def _cmdline_has(pid: str, text: str) -> bool:
    try:
        return text.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _first_private_folder(path: Path) -> Path | None:
    """The first folder on the way to path that other users cannot enter (no o+x), or None."""
    for folder in [*reversed(path.resolve().parents), path.resolve()]:
        if not os.stat(folder).st_mode & 0o001:
            return folder
    return None


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """A 0755 folder under /tmp (a sandbox uid must reach the package) with a Python holding this project's
    packages, as setup.sh's virtualenv would (the project's own interpreter lives under /root, 0700 here)."""
    top = Path(tempfile.mkdtemp(prefix="gs-site-", dir="/tmp"))
    os.chmod(top, 0o755)
    subprocess.run([str(SYSTEM_PY), "-m", "venv", "--without-pip", str(top / "venv")], check=True, timeout=120)
    purelib = next((top / "venv" / "lib").glob("python*/site-packages"))
    site_packages = next(p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir())
    private = _first_private_folder(Path(site_packages))
    if private is not None:  # container mode grades as another uid, which must read the packages (setup.sh's are 0755)
        shutil.rmtree(top, ignore_errors=True)
        pytest.skip(f"this checkout's packages sit under {private}, which another uid cannot enter (a clone in a "
                    "private folder); container mode's sandbox uid could not import them")
    (purelib / "project.pth").write_text(site_packages + "\n")
    yield top
    shutil.rmtree(top, ignore_errors=True)


@pytest.fixture(scope="module")
def root(site):
    """The autograder of ps01_sgd: due date, 10 % per day late, Ann's 1-day extension, 2 graded runs per 24 h."""
    ext = site / "extensions.csv"
    ext.write_text("student,days\nann@uni.edu,1\n")
    return autograder(site, "ag", ["--due", DUE, "--late-penalty", "0.1", "--extensions", str(ext),
                                   "--max-runs-per-day", "2", "--notebook-s", "240"])


def autograder(site: Path, name: str, zip_args: list[str]) -> Path:
    """An empty /autograder-shaped folder with the zip unpacked into source/ and setup.sh run."""
    root = site / name
    for sub in ("source", "submission", "results"):
        (root / sub).mkdir(parents=True)
    os.chmod(root, 0o755)
    out = subprocess.run([sys.executable, "-m", "dsgd_teach.cli", "gradescope", "ps01_sgd", "--out",
                          str(site / f"{name}.zip"), "--source", str(SOURCE.parent.parent), *zip_args],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    with zipfile.ZipFile(site / f"{name}.zip") as zf:
        assert {"setup.sh", "run_autograder", "requirements.txt"} <= set(zf.namelist())
        assert zf.getinfo("run_autograder").external_attr >> 16 & 0o111
        zf.extractall(root / "source")
    assert "bubblewrap" in (root / "source" / "setup.sh").read_text()
    assert "nbclient==" in (root / "source" / "requirements.txt").read_text()
    setup = subprocess.run([*DENY, "bash", str(root / "source" / "setup.sh")], env=_env(site, root), capture_output=True,
                           text=True, timeout=300)
    assert setup.returncode == 0, setup.stdout + setup.stderr
    assert "self-test: the reference solution of ps01_sgd passed all 3 questions' checks" in setup.stdout, setup.stdout
    shutil.copy(root / "source" / "run_autograder", root / "run_autograder")
    return root


def _env(site: Path, root: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DSGD_", "PYTHON"))}
    return {**env, "DSGD_AUTOGRADER_ROOT": str(root), "DSGD_AUTOGRADER_PYTHON": str(site / "venv" / "bin" / "python"),
            **extra}


def submit(site: Path, root: Path, kind: str, meta: dict, **env: str) -> tuple[int, dict, str]:
    """Put one submission and its metadata in place and run run_autograder with namespaces denied."""
    for old in (root / "submission").iterdir():
        old.unlink()
    (root / "results" / "results.json").unlink(missing_ok=True)
    write_submission(SOURCE, root / "submission" / "ps01_sgd.ipynb", kind)
    (root / "submission_metadata.json").write_text(json.dumps(meta))
    proc = subprocess.run(["nice", "-n", "5", *DENY, "bash", str(root / "run_autograder")], cwd=root,
                          env=_env(site, root, **env), capture_output=True, text=True, timeout=600)
    return proc.returncode, json.loads((root / "results" / "results.json").read_text()), proc.stdout + proc.stderr


def meta(created: str, previous: list | None = None) -> dict:
    return {"id": 1, "created_at": created, "assignment": {"due_date": DUE, "title": "PS1"},
            "users": [{"email": "ann@uni.edu", "id": 7, "name": "Ann"}], "previous_submissions": previous or []}


def test_find_notebook_prefers_the_assignments_name(tmp_path):
    """A submission with an Untitled.ipynb beside (or above) ps01_sgd.ipynb is graded as ps01_sgd.ipynb; with no
    notebook of that name, the first one."""
    (tmp_path / "Untitled.ipynb").write_text("{}")
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "ps01_sgd.ipynb").write_text("{}")
    assert find_notebook(tmp_path, "ps01_sgd") == tmp_path / "work" / "ps01_sgd.ipynb"
    (tmp_path / "ps01_sgd.ipynb").write_text("{}")
    assert find_notebook(tmp_path, "ps01_sgd") == tmp_path / "ps01_sgd.ipynb"
    assert find_notebook(tmp_path, "ps02_hogwild") == tmp_path / "Untitled.ipynb"
    (tmp_path / "link.ipynb").symlink_to(tmp_path / "ps01_sgd.ipynb")
    assert find_notebook(tmp_path, "link") == tmp_path / "Untitled.ipynb"  # a link is never read


@needs_root
def test_setup_fails_where_the_image_cannot_grade(site):
    """setup.sh's self-test grades the reference once: a zip whose notebook imports a module the image lacks (as
    ps13's did with torch missing from requirements.txt) fails the image's build, and says why."""
    root = site / "broken"
    for sub in ("source", "submission", "results"):
        (root / sub).mkdir(parents=True)
    build("ps01_sgd", SOURCES, site / "broken.zip", {"container_mode": True, "limits": {"notebook_s": 120}})
    with zipfile.ZipFile(site / "broken.zip") as zf:
        zf.extractall(root / "source")
    nb_path = root / "source" / "assignments" / "ps01_sgd" / "ps01_sgd.ipynb"
    nb = nbformat.read(str(nb_path), as_version=4)
    setup_cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "ps01_sgd_setup")
    setup_cell.source = "import dsgd_module_not_in_the_image\n" + setup_cell.source
    nbformat.write(nb, str(nb_path))
    setup = subprocess.run([*DENY, "bash", str(root / "source" / "setup.sh")], env=_env(site, root), capture_output=True,
                           text=True, timeout=300)
    assert setup.returncode != 0, setup.stdout + setup.stderr
    assert "self-test FAILED" in setup.stderr and "dsgd_module_not_in_the_image" in setup.stderr, setup.stderr


@needs_root
def test_namespaces_are_denied_for_real():
    """The denial the tests rely on: bwrap cannot start, unshare fails, setpriv still works."""
    assert subprocess.run([*DENY, "bwrap", "--ro-bind", "/", "/", "true"], capture_output=True).returncode != 0
    assert subprocess.run([*DENY, "unshare", "--user", "true"], capture_output=True).returncode != 0
    assert subprocess.run([*DENY, "setpriv", "--reuid=4000", "true"], capture_output=True).returncode == 0


@needs_root
def test_gradescope_route_in_container_mode(site, root):
    assert oct(os.stat(root / "source").st_mode & 0o777) == "0o700"

    # The reference solution 2 days and 1 minute after the due date, with Ann's 1-day extension: 1 day and 1 minute
    # late, so 2 started days at 10 % of the 6 points earned.
    rc, doc, log = submit(site, root, "good", meta("2026-12-04T00:00:00+00:00"))
    assert rc == 0, log
    assert_valid(doc)
    points = [t for t in doc["tests"] if t["number"].endswith(".2")]
    assert [t["score"] for t in points] == [2.0, 2.0, 2.0] and {t["visibility"] for t in points} == {"after_due_date"}
    visible = [t for t in doc["tests"] if t["number"].endswith(".1")]
    assert {t["visibility"] for t in visible} == {"visible"} and {t["status"] for t in visible} == {"passed"}
    late = next(t for t in doc["tests"] if t["name"] == "deadline")
    assert late["score"] == pytest.approx(-1.2) and "2 day(s) late" in late["output"] and "extension" in late["output"]
    assert doc["score"] == pytest.approx(4.8)
    assert doc["extra_data"]["dsgd_graded"] is True and "container mode" in doc["extra_data"]["sandbox"]
    assert "container mode" in doc["output"]

    # An attacker that tries to read the solutions from a child process: only its honest points (none).
    rc, doc, log = submit(site, root, "theft_child", meta("2026-12-01T12:00:00+00:00"))
    assert rc == 0, log
    assert_valid(doc)
    assert doc["score"] == 0.0 and all(t["score"] <= 0 for t in doc["tests"]), doc

    # The released stub: nothing, and each question's visible checks say why.
    rc, doc, log = submit(site, root, "stub", meta("2026-12-01T12:00:00+00:00"))
    assert rc == 0, log
    assert_valid(doc)
    assert doc["score"] == 0.0 and doc["extra_data"]["flags"] == [], doc
    assert all(t["status"] == "failed" and "NotImplementedError" in t["output"] for t in doc["tests"]
               if t["number"].endswith(".1")), doc

    # A flagged attack (it echoes what it can of the hidden tests into its reports): 0, flagged, nothing leaked.
    rc, doc, log = submit(site, root, "echo_hidden", meta("2026-12-01T12:00:00+00:00"))
    assert rc == 0, log
    assert_valid(doc)
    assert doc["score"] == 0.0 and [f for f in doc["extra_data"]["flags"] if f.startswith("FLAGGED")], doc

    # Container mode switched off: the same run refuses, and says why.
    rc, doc, log = submit(site, root, "good", meta("2026-12-01T12:00:00+00:00"), DSGD_GRADING_CONTAINER="0")
    assert rc == 1 and doc["score"] == 0.0 and doc["extra_data"]["dsgd_graded"] is False
    assert "no OS sandbox" in doc["output"] and "container mode" in doc["output"]
    assert_valid(doc)


@needs_root
def test_resubmission_limit(site, root):
    """Two graded runs in the last 24 h with a limit of 2: nothing is graded, the last graded score is reported."""
    graded = {"extra_data": {"dsgd_graded": True}, "tests": [{"name": "q1", "score": 2.0, "max_score": 2.0}]}
    previous = [{"submission_time": "2026-12-01T09:00:00+00:00", "score": 3.0, "results": graded},
                {"submission_time": "2026-12-01T10:00:00+00:00", "score": 5.0, "results": graded},
                {"submission_time": "2026-12-01T10:30:00+00:00", "score": 0.0,
                 "results": {"extra_data": {"dsgd_graded": False}}}]
    rc, doc, log = submit(site, root, "stub", meta("2026-12-01T11:00:00+00:00", previous))
    assert rc == 0, log
    assert_valid(doc)
    assert doc["score"] == 5.0 and doc["extra_data"] == {"dsgd_graded": False, "rate_limited": True}
    assert "at most 2 run(s) per 24 hours" in doc["output"] and "2026-12-02 09:00" in doc["output"]
    # The next morning the oldest graded run is more than 24 h old: the run is graded; with a limit of 3 at once.
    assert over_limit(meta("2026-12-02T09:30:00+00:00", previous), 2) is None
    assert over_limit(meta("2026-12-01T11:00:00+00:00", previous), 3) is None
    assert over_limit(meta("2026-12-01T11:00:00+00:00", previous), 2)["score"] == 5.0


@needs_root
def test_local_batch_in_container_mode(site, root):
    """`dsgd-teach grade --container-mode` with namespaces denied: the reference late (a penalty), the reference
    with an extension (none), a stub (0) and CONTAINER_ATTACKS (their honest points only, the flagged one flagged,
    nothing of theirs left running), every row saying how it was isolated."""
    work = Path(tempfile.mkdtemp(prefix="gs-batch-", dir="/tmp"))
    try:
        shutil.copytree(SOURCE.parent, work / "source" / "ps01_sgd")
        subs = work / "subs"
        for student, kind in (("late", "good"), ("extended", "good"), ("stub", "stub"),
                              *((a, a) for a in CONTAINER_ATTACKS)):
            write_submission(SOURCE, subs / student / "ps01_sgd" / "ps01_sgd.ipynb", kind)
        for student in ("late", "extended"):
            (subs / student / "ps01_sgd" / "timestamp.txt").write_text("2026-12-02 10:00:00.000000 UTC")
        (work / "ext.csv").write_text("student,days\nextended,1.5\n")
        for d in ("source", "subs"):
            os.chmod(work / d, 0o700)
        (work / "out").mkdir(mode=0o700)
        grade = ["nice", "-n", "5", *DENY, str(site / "venv" / "bin" / "python"), "-m", "dsgd_teach.cli", "grade",
                 str(subs), "--source", str(work / "source"), "--out", str(work / "out"), "--container-mode",
                 "--jobs", "2", "--no-progress", "--notebook-s", "120", "--due", DUE, "--late-penalty", "0.25",
                 "--extensions", str(work / "ext.csv")]
        # Run from this checkout, the package would be imported from it, and its world-readable sources with it:
        # container mode refuses before any kernel starts.
        proc = subprocess.run(grade, cwd=REPO, env=_env(site, work), capture_output=True, text=True, timeout=600)
        assert proc.returncode == 2 and str(REPO / "course" / "assignments" / "source") in proc.stderr, proc.stderr
        proc = subprocess.run(grade, cwd=work, env={**_env(site, work), "PYTHONPATH": str(root / "lib")},
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        rows = list(csv.DictReader((work / "out" / "grades.csv").open()))
        totals = {s: sum(float(r["points"]) for r in rows if r["student"] == s) for s in {r["student"] for r in rows}}
        honest = {a: sum(HONEST_POINTS.get(a, {}).values()) for a in CONTAINER_ATTACKS}
        assert totals == {"late": 4.5, "extended": 6.0, "stub": 0.0, **honest}
        flagged = {r["student"] for r in rows if r["question"] == "(integrity)" and r["reason"].startswith("FLAGGED")}
        assert FLAGGED & set(CONTAINER_ATTACKS) <= flagged and not flagged & {"late", "extended", "stub"}, flagged
        survivors = [pid for pid in os.listdir("/proc") if pid.isdigit() and _cmdline_has(pid, MARKER)]
        assert not survivors, survivors
        assert {r["sandbox"] for r in rows} == {rows[0]["sandbox"]} and "container mode" in rows[0]["sandbox"]
        page = (work / "out" / "feedback" / "ps01_sgd" / "late.html").read_text()
        assert "1 day(s) late" in page and "-1.5" in page
        assert not [r for r in rows if "ESCAPED" in r["reason"]]
    finally:
        shutil.rmtree(work, ignore_errors=True)
