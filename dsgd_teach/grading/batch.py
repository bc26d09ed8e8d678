"""Grade a class: find the submissions, run each in its own worker process, write grades.csv and feedback HTML."""

from __future__ import annotations

import csv
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat
from tqdm.auto import tqdm

from .feedback import write_feedback
from .notebook import Assignment, load_assignment, nbgrader_meta, rebuild, rewrite_test, source_cells
from .verdict import Grade, check_reference, grade

CSV_FIELDS = ["student", "assignment", "question", "points", "max_points", "reason"]


@dataclass(frozen=True)
class Limits:
    """Per-cell timeout and per-kernel memory and CPU-time limits."""

    timeout_s: int = 60
    memory_mb: int = 1536
    cpu_s: int = 600


@dataclass
class Submission:
    """One student's notebook for one assignment (path None when nothing was handed in)."""

    student: str
    assignment: str
    path: Path | None
    grades: list[Grade] = field(default_factory=list)


def find_submissions(root: Path, assignments: dict[str, Assignment], only: str | None) -> list[Submission]:
    """Submissions under root: <student>/[<assignment>/]*.ipynb or <student>.ipynb (one assignment per notebook)."""
    found: dict[tuple[str, str], Submission] = {}
    students = []
    for entry in sorted(root.iterdir()):
        if entry.is_dir() and not entry.name.startswith("."):
            students.append(entry.name)
            notebooks = sorted(p for p in entry.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
        elif entry.suffix == ".ipynb":
            students.append(entry.stem)
            notebooks = [entry]
        else:
            continue
        for nb_path in notebooks:
            name = _which_assignment(nb_path, assignments)
            if name and (only is None or name == only) and (students[-1], name) not in found:
                found[(students[-1], name)] = Submission(students[-1], name, nb_path)
    if only is not None:
        for student in students:
            found.setdefault((student, only), Submission(student, only, None))
    return sorted(found.values(), key=lambda s: (s.assignment, s.student))


def _which_assignment(path: Path, assignments: dict[str, Assignment]) -> str | None:
    for part in (path.parent.name, path.stem):
        if part in assignments:
            return part
    try:
        nb = nbformat.read(str(path), as_version=4)
    except Exception:  # noqa: BLE001 - unreadable notebooks are matched by name only
        return None
    ids = {str(nbgrader_meta(c).get("grade_id")) for c in nb.cells}
    best = max(assignments.values(), key=lambda a: len(ids & {q.grade_id for q in a.questions}), default=None)
    return best.name if best and ids & {q.grade_id for q in best.questions} else None


def run_worker(cells: list[dict[str, Any]], mode: str, limits: Limits, seed: int,
               protected: list[str]) -> dict[str, Any]:
    """Run one notebook's cells in a fresh worker process (its own session); a dead worker becomes an error."""
    job = {
        "cells": [{**c, "source": rewrite_test(c["source"], mode)} if "grade_id" in c else c for c in cells],
        "timeout": limits.timeout_s, "memory_mb": limits.memory_mb, "cpu_s": limits.cpu_s,
        "seed": seed, "protected": protected,
    }
    budget = limits.timeout_s * (len(cells) + 2) + 180
    with tempfile.TemporaryDirectory(prefix="dsgd-worker-") as cwd:
        proc = subprocess.Popen([sys.executable, "-m", "dsgd_teach.grading.worker"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd, start_new_session=True)
        try:
            out, err = proc.communicate(json.dumps(job).encode(), timeout=budget)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return {"error": f"grading this notebook took longer than {budget} s and was stopped"}
    lines = out.decode(errors="replace").strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        tail = err.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        return {"error": f"the grading process failed (exit {proc.returncode}): {tail[0][:300]}"}


def grade_one(sub: Submission, assignment: Assignment, reference: dict[str, Any], limits: Limits, seed: int,
              protected: list[str]) -> list[Grade]:
    """Grades for one submission; never raises for anything the submission does."""
    def zero(reason: str) -> list[Grade]:
        return [Grade(q.grade_id, 0.0, q.points, reason) for q in assignment.questions]

    if sub.path is None:
        return zero("no notebook submitted")
    try:
        nb = nbformat.read(str(sub.path), as_version=4)
        cells = rebuild(assignment, nb)
    except Exception as exc:  # noqa: BLE001 - a corrupt notebook scores zero with the reason
        return zero(f"could not read the notebook: {type(exc).__name__}: {str(exc)[:200]}")
    result = run_worker(cells, "student", limits, seed, protected)
    if "error" in result:
        return zero(result["error"])
    return grade(assignment, reference, result)


def grade_batch(submissions_dir: Path, source_dir: Path, out_dir: Path, *, assignment: str | None = None,
                limits: Limits = Limits(), seed: int | None = None, jobs: int = 1,
                progress: bool = True) -> list[Submission]:
    """Grade every submission under submissions_dir against the sources; write CSV and feedback into out_dir."""
    from .notebook import find_assignments

    seed = secrets.randbelow(2**31) if seed is None else seed
    sources = find_assignments(source_dir)
    if assignment is not None and assignment not in sources:
        raise ValueError(f"unknown assignment {assignment!r}; known: {', '.join(sources)}")
    assignments = {name: load_assignment(path) for name, path in sources.items()}
    subs = find_submissions(submissions_dir, assignments, assignment)
    out_dir.mkdir(parents=True, exist_ok=True)
    protected = sorted({str(source_dir.resolve()), str(submissions_dir.resolve()), str(out_dir.resolve())})
    t0 = time.perf_counter()
    references = {}
    for name in sorted({s.assignment for s in subs}):
        references[name] = run_worker(source_cells(assignments[name]), "reference", limits, seed, protected)
        if "error" in references[name]:
            raise RuntimeError(f"{name}: the reference run failed: {references[name]['error']}")
        check_reference(assignments[name], references[name])
    bar = tqdm(total=len(subs), desc="grading", unit="notebook", disable=not progress)
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {pool.submit(grade_one, s, assignments[s.assignment], references[s.assignment], limits, seed,
                               protected): s for s in subs}
        for fut in as_completed(futures):
            futures[fut].grades = fut.result()
            bar.update(1)
    bar.close()
    _write_csv(out_dir / "grades.csv", subs)
    for sub in subs:
        write_feedback(out_dir / "feedback" / sub.assignment / f"{sub.student}.html", sub.student, sub.assignment,
                       sub.grades)
    summary = {"seed": seed, "submissions": len(subs), "seconds": round(time.perf_counter() - t0, 1),
               "limits": limits.__dict__}
    (out_dir / "grading.json").write_text(json.dumps(summary, indent=2))
    return subs


def _write_csv(path: Path, subs: list[Submission]) -> None:
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, CSV_FIELDS)
        writer.writeheader()
        for sub in subs:
            for g in sub.grades:
                writer.writerow({"student": sub.student, "assignment": sub.assignment, "question": g.question,
                                 "points": g.points, "max_points": g.max_points, "reason": g.reason})
