"""The Gradescope autograder's run: grade /autograder/submission/*.ipynb and write results/results.json.

`run_autograder` (written by gradescope_cli.py) runs `python -m dsgd_teach.grading.gradescope ROOT`, ROOT being
/autograder or `DSGD_AUTOGRADER_ROOT`. Before any student code runs, the folders holding the solutions, the
metadata and the results are closed to other users. The notebook is graded as `dsgd-teach grade` grades it
(reference run, student run, verdict in this process) in bubblewrap where it can start, else in container mode
when the autograder's config (or `DSGD_GRADING_CONTAINER=1`) switches it on; else grading is refused and the
results say why. Results follow Gradescope's specification (https://gradescope-autograders.readthedocs.io/en/
latest/specs/): per question one `visible` entry for its visible checks (0 points) and one `after_due_date` entry
holding its points, a "(deadline)" entry with the late penalty, `execution_time`, and in `extra_data` the
integrity flags and how the run was isolated. Past the resubmission limit nothing is graded and the score of the
last graded run is reported again.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sys
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

if __name__ == "__main__":  # the autograder's run, one per submission: before nbformat is imported
    from .lean import skip_slow_optional_imports

    skip_slow_optional_imports()

from . import bubblewrap, container, deadlines, safeio  # noqa: E402
from .batch import Limits, run_worker, sandbox_label  # noqa: E402
from .notebook import Assignment, load_assignment, rebuild, source_cells  # noqa: E402
from .submissions import read_notebook  # noqa: E402
from .text import Redactor, clean, safe_grades  # noqa: E402
from .verdict import Grade, check_outcomes, check_reference, grade  # noqa: E402

ROOT_ENV = "DSGD_AUTOGRADER_ROOT"
CONFIG = "dsgd_autograder.json"
MAX_METADATA_BYTES = 32 << 20
WINDOW = timedelta(hours=24)
INTEGRITY = "(integrity)"


def root_dir() -> Path:
    """The autograder's root: DSGD_AUTOGRADER_ROOT, else /autograder."""
    return Path(os.environ.get(ROOT_ENV, "/autograder"))


def fence(root: Path) -> None:
    """Close the sources (solutions), the metadata and the results folder to every user but the grader."""
    for path in (root / "source", root / "results"):
        path.mkdir(exist_ok=True)
        os.chmod(path, 0o700)
    meta = root / "submission_metadata.json"
    if meta.is_file() and not meta.is_symlink():
        os.chmod(meta, 0o600)


def read_metadata(path: Path) -> dict[str, Any]:
    """Gradescope's submission metadata ({} when absent or unreadable), read bounded."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_METADATA_BYTES + 1)
        meta = json.loads(data) if len(data) <= MAX_METADATA_BYTES else {}
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


def student_keys(meta: dict[str, Any]) -> tuple[str, ...]:
    """The submitter's identities (email, Gradescope id, name, SID) in that order, for extensions."""
    users = meta.get("users") if isinstance(meta.get("users"), list) else []
    first = users[0] if users and isinstance(users[0], dict) else {}
    return deadlines.keys_of(first.get(k) for k in ("email", "id", "name", "sid"))


def _time(text: object) -> datetime | None:
    try:
        return deadlines.parse_time(str(text))
    except ValueError:
        return None


def over_limit(meta: dict[str, Any], per_day: int) -> dict[str, Any] | None:
    """None when this run may be graded; else the results to report: the last graded run's score and tests."""
    now = _time(meta.get("created_at"))
    previous = meta.get("previous_submissions") if isinstance(meta.get("previous_submissions"), list) else []
    graded = []
    for p in previous:
        if not isinstance(p, dict) or _time(p.get("submission_time")) is None:
            continue
        results = p.get("results") if isinstance(p.get("results"), dict) else {}
        extra = results.get("extra_data") if isinstance(results.get("extra_data"), dict) else {}
        if extra.get("dsgd_graded", True) is not False:
            graded.append((_time(p["submission_time"]), p, results))
    if now is None or not graded:
        return None
    recent = sorted(t for t, _, _ in graded if now - WINDOW < t <= now)
    if len(recent) < per_day:
        return None
    when, last, results = max(graded, key=lambda g: g[0])
    score = last.get("score")
    tests = [{k: t[k] for k in ("name", "number", "score", "max_score", "status", "output", "visibility") if k in t}
             for t in (results.get("tests") or [])[:200] if isinstance(t, dict)]
    return {"score": float(score) if isinstance(score, (int, float)) else 0.0, "tests": tests,
            "output": clean(f"Not graded: this autograder grades at most {per_day} run(s) per 24 hours. Your next "
                            f"graded run is possible after {(recent[0] + WINDOW):%Y-%m-%d %H:%M %Z}. The score shown "
                            f"is that of your last graded run ({when:%Y-%m-%d %H:%M %Z}).", 600),
            "extra_data": {"dsgd_graded": False, "rate_limited": True}}


def find_notebook(folder: Path, assignment: str | None = None) -> Path | None:
    """The submitted notebook, a regular *.ipynb file (no link) in the folder or one level below: the one named
    after the assignment (e.g. ps01_sgd.ipynb beside an Untitled.ipynb) if there is one, else the first."""
    found = [path for pattern in ("*.ipynb", "*/*.ipynb") for path in sorted(folder.glob(pattern))
             if safeio.lstat_kind(path) == "regular file" and ".ipynb_checkpoints" not in path.parts]
    named = [path for path in found if assignment is not None and path.stem == assignment]
    return (named or found or [None])[0]


def late_policy(config: dict[str, Any], meta: dict[str, Any]) -> deadlines.LatePolicy | None:
    """The run's late policy: the zip's due date, else Gradescope's (the metadata's assignment.due_date), with the
    zip's penalty, cutoff and extensions; None when neither names a due date."""
    assignment = meta.get("assignment") if isinstance(meta.get("assignment"), dict) else {}
    due = config.get("due") or assignment.get("due_date")
    if not due:
        return None
    return deadlines.LatePolicy(deadlines.parse_time(str(due)), float(config.get("late_penalty") or 0.0),
                                config.get("late_cutoff_days"), config.get("extensions") or {})


def grade_notebook(path: Path, assignment: Assignment, limits: Limits, seed: int, protected: list[str],
                   sandbox: bool | str) -> tuple[list[Grade], dict[str, Any], dict[str, Any]]:
    """(grades, reference result, student result) of one notebook, as `dsgd-teach grade` decides them."""
    reference = run_worker(source_cells(assignment), "reference", limits, seed, protected, sandbox=sandbox)
    if "error" in reference:
        raise RuntimeError(f"the reference run failed: {reference['error']}")
    check_reference(assignment, reference)
    zero = [Grade(q.grade_id, 0.0, q.points, "") for q in assignment.questions]
    try:
        cells = rebuild(assignment, read_notebook(path))
    except Exception as exc:  # noqa: BLE001 - an unreadable notebook scores zero with the reason
        why = f"could not read the notebook: {type(exc).__name__}: {str(exc)[:200]}"
        return [Grade(g.question, 0.0, g.max_points, why) for g in zero], reference, {}
    result = run_worker(cells, "student", limits, seed, protected, sandbox=sandbox)
    if "error" in result:
        grades = [Grade(g.question, 0.0, g.max_points, result["error"]) for g in zero]
        if result.get("problems"):
            grades.append(Grade(INTEGRITY, 0.0, 0.0, "FLAGGED: " + "; ".join(result["problems"])))
    else:
        grades = grade(assignment, reference, result)
    return safe_grades(grades, Redactor.for_assignment(assignment, seed)), reference, result


def question_tests(assignment: Assignment, grades: list[Grade], reference: dict[str, Any],
                   result: dict[str, Any], redact: Redactor) -> list[dict[str, Any]]:
    """Gradescope test entries: per question its visible checks (visible, 0 points) and its points (after the
    due date, where it has hidden checks), then the deadline row."""
    by_id = {g.question: g for g in grades}
    tests: list[dict[str, Any]] = []
    for number, q in enumerate(assignment.questions, start=1):
        g = by_id.get(q.grade_id, Grade(q.grade_id, 0.0, q.points, "not graded"))
        expected = reference.get("tests", {}).get(q.grade_id, {}).get("records", [])
        outcomes = check_outcomes(expected, (result.get("tests") or {}).get(q.grade_id)) if result else None
        visible = [(exp["label"], o) for exp, o in zip(expected, outcomes or ["not run"] * len(expected),
                                                       strict=False) if not exp.get("hidden")]
        has_hidden = any(exp.get("hidden") for exp in expected)
        ok = bool(outcomes) and all(o == "passed" for _, o in visible)
        lines = [f"{o}: {label}" for label, o in visible]
        if not ok and "hidden" not in g.reason.lower():
            lines.append(g.reason)
        entry = {"name": f"{q.grade_id}: visible checks", "number": f"{number}.1",
                 "status": "passed" if ok else "failed", "output": "\n".join(lines) or "no visible checks",
                 "visibility": "visible", "score": 0.0 if has_hidden else g.points,
                 "max_score": 0.0 if has_hidden else g.max_points}
        tests.append(entry)
        if has_hidden:
            tests.append({"name": f"{q.grade_id}: points (visible and hidden checks)", "number": f"{number}.2",
                          "score": g.points, "max_score": g.max_points,
                          "status": "passed" if g.points >= g.max_points else "failed", "output": g.reason,
                          "visibility": "after_due_date"})
    for g in grades:
        if g.question == deadlines.ROW:
            tests.append({"name": "deadline", "number": str(len(assignment.questions) + 1), "score": g.points,
                          "max_score": 0.0, "status": "passed" if g.points == 0 else "failed", "output": g.reason,
                          "visibility": "visible"})
    for t in tests:
        t["name"], t["output"] = clean(redact(t["name"]), 200), clean(redact(t["output"]), 4000, escape=False)
        t["score"], t["max_score"] = float(t["score"]), float(t["max_score"])
    return tests


def results_doc(assignment: Assignment, grades: list[Grade], reference: dict[str, Any], result: dict[str, Any],
                redact: Redactor, sandbox: bool | str, seconds: float) -> dict[str, Any]:
    """One run's results.json document."""
    tests = question_tests(assignment, grades, reference, result, redact)
    flags = [g.reason for g in grades if g.question == INTEGRITY]
    score = max(0.0, sum(g.points for g in grades if g.question != INTEGRITY))
    return {"score": round(score, 4), "execution_time": int(round(seconds)), "output": clean(
                f"{assignment.name}: graded by dsgd-teach ({sandbox_label(sandbox)}). Visible checks are shown now; "
                "each question's points, which include hidden checks, after the due date.", 600),
            "visibility": "visible", "stdout_visibility": "hidden", "tests": tests,
            "extra_data": {"dsgd_graded": True, "flags": flags, "sandbox": sandbox_label(sandbox)}}


def refusal_doc(why: str, seconds: float) -> dict[str, Any]:
    """The results of a run that could not be graded here (no sandbox): 0 points and the reason."""
    return {"score": 0.0, "execution_time": int(round(seconds)), "visibility": "visible", "tests": [],
            "output": clean(f"Not graded: {why}", 2000), "stdout_visibility": "hidden",
            "extra_data": {"dsgd_graded": False, "refused": clean(why, 2000)}}


def _write(root: Path, doc: dict[str, Any]) -> None:
    safeio.write_atomic(root / "results", "results.json", json.dumps(doc, indent=1).encode())


def load_config(root: Path) -> dict[str, Any]:
    """The autograder's settings written into the zip by gradescope_cli.py."""
    return json.loads((root / "source" / CONFIG).read_text())


def _container_switch(config: dict[str, Any]) -> bool:
    env = os.environ.get(container.SWITCH)
    return env == "1" if env in ("0", "1") else bool(config.get("container_mode", False))


def run(root: Path) -> int:
    """Grade the submission under root; 0 when results.json was written with a grade, 1 when grading refused."""
    t0 = time.monotonic()
    config = load_config(root)
    fence(root)
    meta = read_metadata(root / "submission_metadata.json")
    if config.get("max_runs_per_day"):
        limited = over_limit(meta, int(config["max_runs_per_day"]))
        if limited is not None:
            _write(root, {**limited, "execution_time": int(time.monotonic() - t0), "visibility": "visible"})
            return 0
    sandbox = container.select(False, _container_switch(config))
    assignment = load_assignment(root / "source" / "assignments" / config["assignment"] /
                                 f"{config['assignment']}.ipynb")
    notebook = find_notebook(root / "submission", config["assignment"])
    try:
        container.require() if sandbox == "container" else bubblewrap.require()
    except bubblewrap.SandboxUnavailable as exc:
        _write(root, refusal_doc(str(exc), time.monotonic() - t0))
        print(f"refused: {exc}", file=sys.stderr)
        return 1
    seed = secrets.randbelow(2**31)
    limits = _limits(config)
    with tempfile.TemporaryDirectory(prefix="gs-work-") as work:
        own = Path(work) / "submission.ipynb"
        if notebook is not None:
            shutil.copyfile(notebook, own, follow_symlinks=False)
        protected = sorted({str((root / "source").resolve()), str((root / "results").resolve()), work})
        if sandbox == "container":
            container.require_fenced(protected)
        if notebook is None:
            grades = [Grade(q.grade_id, 0.0, q.points, "no .ipynb file in the submission") for q in
                      assignment.questions]
            reference, result = {}, {}
        else:
            try:
                grades, reference, result = grade_notebook(own, assignment, limits, seed, protected, sandbox)
            except Exception as exc:  # noqa: BLE001 - the instructor's or the machine's failure: say so, grade nothing
                why = f"the autograder failed ({type(exc).__name__}: {clean(exc, 300)}); ask your instructor"
                _write(root, refusal_doc(why, time.monotonic() - t0))
                print(f"error: {why}", file=sys.stderr)
                return 1
    policy = late_policy(config, meta)
    if policy is not None:
        submitted = _time(meta.get("created_at")) or datetime.now(policy.due.tzinfo)
        grades = policy.apply(grades, submitted, *student_keys(meta))
    doc = results_doc(assignment, grades, reference, result, Redactor.for_assignment(assignment, seed), sandbox,
                      time.monotonic() - t0)
    _write(root, doc)
    print(f"graded {assignment.name}: {doc['score']:g} points ({sandbox_label(sandbox)})")
    return 0


def _limits(config: dict[str, Any]) -> Limits:
    lim = config.get("limits", {})
    return Limits(lim.get("timeout_s", 60), lim.get("memory_mb", 1536), lim.get("cpu_s", 600),
                  lim.get("notebook_s", 300))


def self_test(root: Path) -> int:
    """setup.sh's last step: say which sandbox this image has, then grade the reference solution once, so that an
    image that cannot grade (a module the notebook imports missing, a broken kernel) fails while it is built, not
    at the first student's run. 0 when the reference ran and passed every one of its checks, else 1."""
    config = load_config(root)
    fence(root)
    why = bubblewrap.probe()
    print("bubblewrap sandbox: " + ("available" if not why else f"not available ({why})"))
    print("container mode: " + (container.probe() or "available"))
    assignment = load_assignment(root / "source" / "assignments" / config["assignment"] /
                                 f"{config['assignment']}.ipynb")
    sandbox = container.select(False, _container_switch(config))
    try:
        container.require() if sandbox == "container" else bubblewrap.require()
    except bubblewrap.SandboxUnavailable as exc:
        # The image's builder may deny what the grading run allows: the reference is the instructor's own code,
        # so it runs here with the kernel's fence but no OS sandbox, which still proves the image can run it.
        print(f"self-test: no OS sandbox while the image is built ({clean(exc, 300)}); the reference runs "
              "without one")
        sandbox = False
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gs-selftest-") as work:
        protected = sorted({str((root / "source").resolve()), str((root / "results").resolve()), work})
        try:
            if sandbox == "container":
                container.require_fenced(protected)
            reference = run_worker(source_cells(assignment), "reference", _limits(config), secrets.randbelow(2**31),
                                   protected, sandbox=sandbox)
            if "error" in reference:
                raise RuntimeError(reference["error"])
            if reference.get("cell_errors"):  # e.g. an import the image cannot satisfy, named at its source
                first = reference["cell_errors"][0]
                raise RuntimeError(f"code cell {first.get('index')} raised {clean(first.get('error'), 600)}")
            check_reference(assignment, reference)
        except Exception as exc:  # noqa: BLE001 - any failure fails the image's build, with the reason
            print(f"self-test FAILED: the reference solution of {assignment.name} does not grade in this image "
                  f"({sandbox_label(sandbox)}): {type(exc).__name__}: {clean(exc, 2000, escape=False)}",
                  file=sys.stderr)
            return 1
    print(f"self-test: the reference solution of {assignment.name} passed all {len(assignment.questions)} "
          f"questions' checks in {time.monotonic() - t0:.0f} s ({sandbox_label(sandbox)})")
    return 0


def main(argv: list[str]) -> int:
    """`python -m dsgd_teach.grading.gradescope [ROOT] [--self-test]`."""
    args = [a for a in argv if a != "--self-test"]
    root = Path(args[0]) if args else root_dir()
    if "--self-test" in argv:
        return self_test(root)
    return run(root)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
