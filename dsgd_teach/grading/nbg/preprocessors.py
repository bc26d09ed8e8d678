"""nbgrader preprocessors that put dsgd-teach's verdicts into nbgrader's own autograde and feedback steps.

`DsgdGrade` replaces nbgrader's `Execute` in `Autograde.autograde_preprocessors`: it grades the submission with
the dsgd-teach grader (reference run and student run in fenced worker processes, values compared in this
process) and writes each test cell's verdict as the cell's output, so nbgrader's own `SaveAutoGrades` stores the
points in the gradebook. `DsgdComments` (after `SaveAutoGrades`) writes the reasons as comments, and
`RedactFeedback` (in `GenerateFeedback.preprocessors`) keeps hidden tests and oracles out of feedback pages.
"""

from __future__ import annotations

import json
import os
import secrets
import tempfile
from pathlib import Path
from typing import Any

import nbformat
from nbgrader.api import Gradebook
from nbgrader.coursedir import CourseDirectory
from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import Integer

from .. import batch as grading
from ..batch import Limits, Submission
from ..notebook import Assignment, nbgrader_meta
from ..text import clean
from ..verdict import Grade
from .batches import GradingBatch, GradingEnvironmentError, log_path_for
from .guard import notes_of
from .redact import REF_PATTERN, redact_source, redact_text, verdict_lines, verdict_outputs

RESOURCE_KEY = "dsgd_grading"
NOTES = "(notes)"  # a row of the grader's notes on the submission (its nbgrader metadata problems), 0 points
ENVIRONMENT_FAILURES = ("grading kernel failed to start", "the grading process failed")


class DsgdGrade(NbGraderPreprocessor):
    """Grade a sanitized submission with dsgd-teach's verdict and write each test cell's result as its output."""

    seed = Integer(None, allow_none=True, help="Hidden-input seed; default: a fresh one per batch. Pass the seed "
                   "of an earlier batch (from dsgd_grading_batches.jsonl) to re-grade it identically.").tag(config=True)
    timeout_s = Integer(60, help="Seconds per cell.").tag(config=True)
    memory_mb = Integer(1536, help="Address-space limit per grading kernel (MB).").tag(config=True)
    cpu_s = Integer(600, help="CPU seconds per grading kernel.").tag(config=True)
    notebook_s = Integer(900, help="Wall-clock seconds per notebook, whatever its number of cells.").tag(config=True)
    kill_grace_s = Integer(60, help="Seconds after notebook_s before the grader kills a sandbox that has not "
                           "returned (its submission: 'took longer than N s').").tag(config=True)

    def preprocess(self, nb: Any, resources: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        info = resources["nbgrader"]
        batch = self._batch(info["db_url"])
        if batch.failure:
            raise GradingEnvironmentError(f"not grading {info['student']}: {batch.failure}")
        coursedir = self._coursedir()
        source = Path(coursedir.format_path(coursedir.source_directory, ".", info["assignment"]))
        assignment, reference = batch.reference(source / f"{info['notebook']}.ipynb", info["assignment"],
                                                info["notebook"])
        notes = notes_of(nb)
        if notes.get("unreadable"):  # read bounded by BoundedExporter: nothing of it reaches a worker
            grades = [Grade(q.grade_id, 0.0, q.points, clean(f"could not read the notebook: {notes['unreadable']}"))
                      for q in assignment.questions]
        else:
            grades = self._grade_student(batch, assignment, reference, nb, info["student"])
        if notes.get("problems"):
            grades.append(Grade(NOTES, 0.0, 0.0, clean("; ".join(notes["problems"]), 1000)))
        _apply(nb, assignment, reference, grades)
        resources[RESOURCE_KEY] = {"order": [q.grade_id for q in assignment.questions],
                                   "grades": {g.question: g.__dict__ for g in grades}}
        flags = [g.reason for g in grades if g.question == "(integrity)"]
        if flags:
            self.log.warning("%s/%s: %s", info["student"], info["assignment"], flags[0])
        batch.record({"assignment": info["assignment"], "notebook": info["notebook"], "student": info["student"],
                      "points": sum(g.points for g in grades), "max_points": assignment.max_points, "flags": flags,
                      "notes": [g.reason for g in grades if g.question == NOTES]})
        return nb, resources

    def _batch(self, db_url: str) -> GradingBatch:
        owner = self.parent if self.parent is not None else self
        batch = getattr(owner, "_dsgd_batch", None)
        if batch is None:
            coursedir = self._coursedir()
            seed = secrets.randbelow(2**31) if self.seed is None else int(self.seed)
            exchange = self.config.get("Exchange", {}).get("root")
            protected = sorted({os.path.realpath(p) for p in (coursedir.root or ".", exchange) if p})
            batch = GradingBatch(seed, Limits(self.timeout_s, self.memory_mb, self.cpu_s, self.notebook_s,
                                        kill_grace_s=self.kill_grace_s),
                                 log_path_for(db_url, coursedir.root or "."), protected)
            owner._dsgd_batch = batch
            self.log.info("dsgd-teach grading batch %s: hidden-input seed %d (recorded in %s)", batch.batch_id,
                          seed, batch.log_path)
        return batch

    def _coursedir(self) -> CourseDirectory:
        converter = getattr(self.parent, "parent", None)
        found = getattr(converter, "coursedir", None)
        return found if isinstance(found, CourseDirectory) else CourseDirectory(config=self.config)

    def _grade_student(self, batch: GradingBatch, assignment: Assignment, reference: dict[str, Any], nb: Any,
                       student: str) -> list[Grade]:
        """grade_one on a private copy of the sanitized notebook; an environment failure raises, never zeros."""
        with tempfile.TemporaryDirectory(prefix="dsgd-nbgrader-") as tmp:
            path = Path(tmp) / f"{assignment.name}.ipynb"
            nbformat.write(nb, str(path))
            sub = Submission(student, assignment.name, path)
            grades = grading.grade_one(sub, assignment, reference, batch.limits, batch.seed, batch.protected)
        scored = [g for g in grades if not g.question.startswith("(")]
        if scored and all(any(m in g.reason for m in ENVIRONMENT_FAILURES) for g in scored):
            why = batch.probe()  # the student's own run cannot say whether the environment failed: ask a probe
            if why:
                batch.fail(f"grading {student}/{assignment.name}: {scored[0].reason}; a probe sandbox failed too: "
                           f"{why}")
        return grades


def _apply(nb: Any, assignment: Assignment, reference: dict[str, Any], grades: list[Grade]) -> None:
    """Each test cell: its visible code only, and the verdict as its one output; missing test cells re-added."""
    by_id = {g.question: g for g in grades}
    seen = set()
    for cell in nb.cells:
        meta = nbgrader_meta(cell)
        gid = str(meta.get("grade_id", ""))
        if cell.cell_type == "code" and meta.get("grade") and not meta.get("solution") and gid in by_id:
            _set_verdict(cell, reference["tests"][gid]["records"], by_id[gid])
            seen.add(gid)
    for q in assignment.questions:
        if q.grade_id not in seen:
            cell = nbformat.v4.new_code_cell(q.source)
            cell.metadata["nbgrader"] = {"grade": True, "grade_id": q.grade_id, "locked": True, "points": q.points,
                                         "schema_version": 3, "solution": False, "task": False}
            _set_verdict(cell, reference["tests"][q.grade_id]["records"], by_id[q.grade_id])
            nb.cells.append(cell)


def _set_verdict(cell: Any, records: list[dict[str, Any]], grade: Grade) -> None:
    cell.source = redact_source(cell.source)
    cell.outputs = verdict_outputs(records, grade)
    cell.execution_count = None


class DsgdComments(NbGraderPreprocessor):
    """After SaveAutoGrades: write each question's verdict as the comment on the answer cells before its test."""

    def preprocess(self, nb: Any, resources: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        verdicts = resources.get(RESOURCE_KEY)
        if not verdicts:
            return nb, resources
        info = resources["nbgrader"]
        grades = {gid: Grade(**g) for gid, g in verdicts["grades"].items()}
        pending: list[str] = []
        comments: dict[str, str] = {}
        for cell in nb.cells:
            meta = nbgrader_meta(cell)
            gid = str(meta.get("grade_id", ""))
            if meta.get("solution"):
                pending.append(gid)
            elif gid in grades:
                for solution in pending:
                    comments[solution] = f"{gid}: " + "\n".join(verdict_lines([], grades[gid]))
                pending = []
        for extra in ("(integrity)", NOTES):
            if extra in grades and comments:
                first = next(iter(comments))
                comments[first] += "\n" + grades[extra].reason
        with Gradebook(info["db_url"]) as gb:
            for solution, text in comments.items():
                comment = gb.find_comment(solution, info["notebook"], info["assignment"], info["student"])
                comment.auto_comment = text
            gb.db.commit()
        return nb, resources


class RedactFeedback(NbGraderPreprocessor):
    """GenerateFeedback: strip hidden tests and oracles from every cell and output, then refuse if any remain."""

    def preprocess(self, nb: Any, resources: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        for cell in nb.cells:
            cell.source = redact_source(cell.source)
            for out in cell.get("outputs", []):
                _redact_output(out)
        text = json.dumps(nb)
        if "HIDDEN TESTS" in text or REF_PATTERN.search(text):
            raise GradingEnvironmentError("a feedback page would still show a hidden test or an oracle; not writing it")
        return nb, resources


def _redact_output(out: Any) -> None:
    if out.get("output_type") == "error":
        out["evalue"] = redact_text(str(out.get("evalue", ""))).rstrip("\n")
        out["traceback"] = [redact_text(line).rstrip("\n") for line in out.get("traceback", [])]
    elif out.get("output_type") == "stream":
        out["text"] = redact_text(str(out.get("text", "")))
    for mime, value in list(out.get("data", {}).items()):
        if isinstance(value, str):
            out["data"][mime] = redact_text(value)
