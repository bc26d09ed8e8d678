"""Grade a class: find the submissions, run each in its own OS sandbox, write grades.csv and feedback HTML."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from . import bubblewrap, cgroups, container, reports, safeio
from .cgroup_extras import socket_budget
from .feedback import write_feedback
from .notebook import Assignment, load_assignment, rebuild, rewrite_test, source_cells
from .submissions import SKIPPED, Submission, find_submissions, read_notebook
from .text import Redactor, clean, safe_grades
from .verdict import Grade, check_reference, grade

CSV_FIELDS = ["student", "assignment", "question", "points", "max_points", "reason", "sandbox"]
SANDBOXED = "bubblewrap"
UNSAFE = "NONE: graded with --unsafe-no-sandbox, these grades are not protected against a hostile class"
KILL_GRACE_S = 60  # after the notebook's budget: shutting the kernel down and sending the result
WORKER_MB = 512  # a sandbox's memory beyond its kernel's --memory-mb: the worker, /tmp's files, page cache
_unenforced: set[str] = set()  # why a sandbox of this process ran without its cgroup limits
_unenforced_lock = threading.Lock()


@dataclass(frozen=True)
class Limits:
    """Per-cell timeout, one wall-clock budget per notebook, per-kernel memory and CPU-time limits, and the
    whole sandbox's cgroup limits: memory (memfd and /tmp included; 0: memory_mb + WORKER_MB), processes and
    socket buffers (a share of the host's TCP pressure threshold: one of `jobs` sandboxes at once)."""

    timeout_s: int = 60
    memory_mb: int = 1536
    cpu_s: int = 600
    notebook_s: int = 900
    sandbox_memory_mb: int = 0
    sandbox_pids: int = 128
    kill_grace_s: int = KILL_GRACE_S  # after notebook_s, the grader kills the sandbox whatever it is doing
    jobs: int = 1  # sandboxes at once: each may hold 1/jobs of the host's TCP memory before its pressure point

    def cgroup(self) -> cgroups.CgroupLimits:
        """The cgroup limits of one sandbox (every sandbox gets the same CPU weight)."""
        memory = (self.sandbox_memory_mb or self.memory_mb + WORKER_MB) << 20
        return cgroups.CgroupLimits(memory, self.sandbox_pids, socket_bytes=socket_budget(self.jobs, memory))


def sandbox_label(sandbox: bool | str) -> str:
    """What grades.csv's `sandbox` column and grading.json say about how a batch was isolated."""
    if sandbox == "container":
        return container.LABEL
    return SANDBOXED if sandbox else UNSAFE


def run_worker(cells: list[dict[str, Any]], mode: str, limits: Limits, seed: int,
               protected: list[str], *, sandbox: bool | str = True) -> dict[str, Any]:
    """Run one notebook's cells in a fresh worker (and kernel) inside its own OS sandbox; errors become {"error"}.

    sandbox=True: bubblewrap; "container": container mode (container.py, where no namespace can be made). With
    sandbox=False the worker is an ordinary process of the grading user (the unsafe, audit-hook-only mode).
    Either way every process of the run is gone when this returns.
    """
    job = {
        "cells": [{**c, "source": rewrite_test(c["source"], mode)} if "grade_id" in c else c for c in cells],
        "timeout": limits.timeout_s, "memory_mb": limits.memory_mb, "cpu_s": limits.cpu_s,
        "seed": seed, "protected": [] if sandbox else protected, "budget_s": limits.notebook_s,
    }
    budget = limits.notebook_s + limits.kill_grace_s  # the worker stops at notebook_s; this is the hard stop
    if sandbox:
        runner = container.run if sandbox == "container" else bubblewrap.run
        out = runner([sys.executable, "-m", "dsgd_teach.grading.worker"], json.dumps(job).encode(), budget,
                             limits=limits.cgroup())
        if out.timed_out:
            result = {"error": f"grading this notebook took longer than {budget} s and was stopped"}
        else:
            result = _parse_result(out.result, out.returncode, out.stderr_tail, mode)
        return _with_limits(result, out.usage)
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
    return _parse_result(lines[-1].encode() if lines else None, proc.returncode, err.decode(errors="replace"), mode)


def _with_limits(result: dict[str, Any], usage: cgroups.Usage | None) -> dict[str, Any]:
    """The result with the cgroup limits the sandbox hit named in its error or its note (read by the verdict)."""
    if usage is not None and not usage.enforced:
        with _unenforced_lock:
            _unenforced.add(usage.unenforced)
    hits = "; ".join(usage.hit()) if usage is not None else ""
    if not hits:
        return result
    if "error" in result:
        return {**result, "error": f"{result['error']} ({hits})"}
    return {**result, "stopped": "; ".join(x for x in (result.get("stopped"), hits) if x)}


def unenforced() -> list[str]:
    """Why sandboxes of this process ran without cgroup limits (empty: every one had them)."""
    with _unenforced_lock:
        return sorted(_unenforced)


def note_unenforced(why: str) -> None:
    """Record that a sandbox run elsewhere (on a cluster's worker) had no cgroup limits, and why."""
    with _unenforced_lock:
        _unenforced.add(why)


def _parse_result(data: bytes | None, returncode: int | None, stderr: str, mode: str) -> dict[str, Any]:
    """The worker's result checked against the report schema, or {"error"} saying why there is none."""
    if data:
        try:
            return reports.parse(data, mode)
        except reports.BadReport as exc:
            why = f"the grading process sent a result the grader refused: {exc}"
            return {"error": why, "problems": [why]}
    tail = stderr.strip().splitlines()[-1:] or ["no output"]
    return {"error": f"the grading process failed (exit {returncode}): {clean(tail[0], 300)}"}


def grade_one(sub: Submission, assignment: Assignment, reference: dict[str, Any], limits: Limits, seed: int,
              protected: list[str], *, sandbox: bool | str = True, run: Callable[..., dict[str, Any]] | None = None,
              ) -> list[Grade]:
    """Grades for one submission, every reason short, one line and free of hidden tests; never raises.

    run: what runs the cells (default run_worker, here; cluster.ClusterRun: on a dask cluster's worker)."""
    try:
        grades = _grade_one(sub, assignment, reference, limits, seed, protected, sandbox=sandbox,
                            run=run or run_worker)
    except Exception as exc:  # noqa: BLE001 - whatever goes wrong with one submission is that submission's failure
        why = f"grading this submission failed ({type(exc).__name__})"
        grades = _zero(assignment, why) + [Grade("(integrity)", 0.0, 0.0, f"FLAGGED: {why}")]
    return safe_grades(grades, Redactor.for_assignment(assignment, seed))


def _zero(assignment: Assignment, reason: str) -> list[Grade]:
    return [Grade(q.grade_id, 0.0, q.points, reason) for q in assignment.questions]


def _grade_one(sub: Submission, assignment: Assignment, reference: dict[str, Any], limits: Limits, seed: int,
               protected: list[str], *, sandbox: bool | str, run: Callable[..., dict[str, Any]]) -> list[Grade]:
    if sub.path is None:
        return _zero(assignment, sub.note or "no notebook submitted")
    try:
        nb = read_notebook(sub.path)
        cells = rebuild(assignment, nb)
    except Exception as exc:  # noqa: BLE001 - a corrupt notebook scores zero with the reason
        return _zero(assignment, f"could not read the notebook: {type(exc).__name__}: {str(exc)[:200]}")
    result = run(cells, "student", limits, seed, protected, sandbox=sandbox)
    if "error" in result:  # flagged only for what the grader itself observed (a refused result), never a death
        problems = result.get("problems") or []
        flagged = [Grade("(integrity)", 0.0, 0.0, "FLAGGED: " + "; ".join(problems))] if problems else []
        return _zero(assignment, result["error"]) + flagged
    return grade(assignment, reference, result)


def grade_batch(submissions_dir: Path, source_dir: Path, out_dir: Path, *, assignment: str | None = None,
                limits: Limits = Limits(), seed: int | None = None, jobs: int = 1,
                progress: bool = True, sandbox: bool | str = True,
                late: Callable[[Submission], list[Grade]] | None = None,
                run: Callable[..., dict[str, Any]] | None = None) -> list[Submission]:
    """Grade every submission under submissions_dir against the sources; write CSV and feedback into out_dir.

    sandbox=True (the default) runs every worker and kernel in its own bubblewrap sandbox and raises
    bubblewrap.SandboxUnavailable (a RuntimeError saying how to get one) when none can be built here;
    sandbox="container" runs them in container mode (container.require). `late` gives a submission's grades with
    its late penalty applied (deadlines.py), after grading and before anything is written. `run` runs each
    notebook's cells (default run_worker, on this machine; a cluster.ClusterRun on a dask cluster's workers, which
    check their own sandboxes).
    """
    from .notebook import find_assignments

    local = run is None
    run = run or run_worker
    if sandbox and local:
        container.require() if sandbox == "container" else bubblewrap.require()
        cgroups.sweep()
    if sandbox:
        with _unenforced_lock:
            _unenforced.clear()
        if local and cgroups.available():
            print(f"WARNING: {cgroups_missing(cgroups.available())}", file=sys.stderr)
    seed = secrets.randbelow(2**31) if seed is None else seed
    limits = dataclasses.replace(limits, jobs=max(1, jobs))
    sources = find_assignments(source_dir)
    if assignment is not None and assignment not in sources:
        raise ValueError(f"unknown assignment {assignment!r}; known: {', '.join(sources)}")
    assignments = {name: load_assignment(path) for name, path in sources.items()}
    subs = find_submissions(submissions_dir, assignments, assignment)
    out_dir.mkdir(parents=True, exist_ok=True)
    graded = [s for s in subs if s.assignment in assignments]
    outputs = ["grades.csv", "grading.json"] + [_feedback_path(s) for s in graded]
    safeio.preflight(out_dir, outputs)  # a FIFO or link where an output goes stops the batch before any kernel
    protected = sorted({str(source_dir.resolve()), str(submissions_dir.resolve()), str(out_dir.resolve())})
    if sandbox == "container":
        container.require_fenced(protected)
    t0 = time.perf_counter()
    references = {}
    for name in sorted({s.assignment for s in graded}):
        references[name] = run(source_cells(assignments[name]), "reference", limits, seed, protected,
                               sandbox=sandbox)
        if "error" in references[name]:
            raise RuntimeError(f"{name}: the reference run failed: {references[name]['error']}")
        check_reference(assignments[name], references[name])
    for sub in subs:
        if sub.assignment not in assignments:
            sub.grades = [Grade(SKIPPED, 0.0, 0.0, sub.note)]
    bar = tqdm(total=len(graded), desc="grading", unit="notebook", disable=not progress)
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {pool.submit(grade_one, s, assignments[s.assignment], references[s.assignment], limits, seed,
                               protected, sandbox=sandbox, run=run): s for s in graded}
        for fut in as_completed(futures):
            sub = futures[fut]
            try:
                sub.grades = fut.result()
            except Exception as exc:  # noqa: BLE001 - grade_one does not raise; should it, one row fails, not all
                sub.grades = _zero(assignments[sub.assignment], f"grading this submission failed ({type(exc).__name__})")
            bar.update(1)
    bar.close()
    for sub in graded if late is not None else []:
        sub.grades = late(sub)
    # Every sandbox of the batch has been reaped (run_worker returns only then): nothing can touch what follows.
    safeio.write_atomic(out_dir, "grades.csv", _csv_text(subs, sandbox).encode())
    unwritten = []
    for sub in graded:
        try:
            write_feedback(out_dir / _feedback_path(sub), sub.student, sub.assignment, sub.grades,
                           unsafe=not sandbox, root=out_dir)
        except (OSError, ValueError, safeio.UnsafeOutput) as exc:  # one unwritable page costs no other page
            unwritten.append(f"{_feedback_path(sub)}: {clean(exc, 200)}")
    summary = {"seed": seed, "submissions": len(graded), "seconds": round(time.perf_counter() - t0, 1),
               "limits": limits.__dict__, "sandbox": sandbox_label(sandbox),
               "feedback_not_written": unwritten, "cgroup_limits": _cgroup_summary(limits, sandbox)}
    safeio.write_atomic(out_dir, "grading.json", json.dumps(summary, indent=2).encode())
    return subs


def cgroups_missing(why: str) -> str:
    """What a batch without per-sandbox cgroups does not enforce, and why."""
    return ("per-sandbox cgroup limits are NOT enforced (memory with memfd and /tmp, processes, a fair CPU share): "
            f"{why}. Only per-process rlimits apply; run the grader as root or in a delegated cgroup v2 subtree.")


def _cgroup_summary(limits: Limits, sandbox: bool | str) -> dict[str, Any]:
    """grading.json's record of the per-sandbox cgroup limits: what they were, or why they were not enforced."""
    if not sandbox:
        return {"enforced": False, "why": "graded with --unsafe-no-sandbox"}
    missing = unenforced()
    cg = limits.cgroup()
    return {"enforced": not missing, "why": "; ".join(missing)[:1000], "memory_mb": cg.memory_bytes >> 20,
            "pids": cg.pids, "cpu": f"equal weight {cg.cpu_weight} per sandbox", "socket_mb": cg.socket_bytes >> 20,
            "socket": cgroups.socket_rule(), "io": cgroups.io_rule()}


def _feedback_path(sub: Submission) -> str:
    return f"feedback/{sub.assignment}/{sub.student}.html"


def _csv_text(subs: list[Submission], sandbox: bool | str) -> str:
    buf = io.StringIO(newline="")
    writer = csv.DictWriter(buf, CSV_FIELDS)
    writer.writeheader()
    for sub in subs:
        for g in sub.grades:
            writer.writerow({"student": clean(sub.student, 200), "assignment": clean(sub.assignment, 200),
                             "question": clean(g.question, 200), "points": g.points, "max_points": g.max_points,
                             "reason": clean(g.reason),
                             "sandbox": sandbox_label(sandbox)})
    return buf.getvalue()
