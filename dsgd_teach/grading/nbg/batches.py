"""One grading batch of the nbgrader route: its hidden-input seed, its reference runs, and its record on disk.

A batch is one run of nbgrader's Autograde converter (one `nbgrader autograde` command, or one click on
formgrader's autograde button). Its seed is fresh unless the instructor passes the seed of an earlier batch to
re-grade it; every graded notebook appends a line to `dsgd_grading_batches.jsonl` next to the gradebook.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import batch as grading
from ..batch import Limits
from ..notebook import Assignment, load_assignment, source_cells
from ..verdict import check_reference

BATCH_LOG = "dsgd_grading_batches.jsonl"
PROBE = "dsgd_probe"


class GradingEnvironmentError(RuntimeError):
    """The grading machinery itself failed (no package, a kernel that never starts): never turned into zeros."""


@dataclass
class GradingBatch:
    """State shared by every notebook one Autograde run grades."""

    seed: int
    limits: Limits
    log_path: Path
    protected: list[str]
    batch_id: str = field(default_factory=lambda: time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
                          + "-" + secrets.token_hex(3))
    references: dict[tuple[str, str], tuple[Assignment, dict[str, Any]]] = field(default_factory=dict)
    failure: str | None = None

    def reference(self, source: Path, assignment_id: str, notebook_id: str) -> tuple[Assignment, dict[str, Any]]:
        """The source notebook and its reference run for this batch's seed (run once per notebook per batch)."""
        key = (assignment_id, notebook_id)
        if key not in self.references:
            if not source.is_file():
                self.fail(f"source notebook {source} not found; the nbgrader route grades against the course's "
                          "source/ folder")
            assignment = load_assignment(source)
            result = grading.run_worker(source_cells(assignment), "reference", self.limits, self.seed, self.protected)
            if "error" in result:
                self.fail(f"{assignment_id}/{notebook_id}: the reference run failed: {result['error']}")
            try:
                _raise_if_never_started(result, f"{assignment_id}/{notebook_id}: the reference run")
                check_reference(assignment, result)
            except RuntimeError as exc:  # a dead kernel or a source failing its own tests: stop the batch
                self.fail(str(exc))
            self.references[key] = (assignment, result)
        return self.references[key]

    def probe(self) -> str:
        """'' when a fresh sandbox under this batch's limits runs a cell and reports, else why not (grader-side)."""
        cells = [{"source": "check('probe', 1, 1)", "grade_id": PROBE}]
        result = grading.run_worker(cells, "reference", self.limits, self.seed, self.protected)
        test = result.get("tests", {}).get(PROBE, {})
        if "error" in result or test.get("status") != "ok" or not test.get("records"):
            return str(result.get("error") or test.get("error") or test.get("status") or "no report")[:300]
        return ""

    def fail(self, message: str) -> None:
        """Remember an environment failure (later notebooks fail fast with it) and raise it."""
        self.failure = message
        raise GradingEnvironmentError(message)

    def record(self, entry: dict[str, Any]) -> None:
        """Append one graded notebook's line (batch id, seed, scores) to the batch log next to the gradebook."""
        line = {"batch": self.batch_id, "seed": self.seed, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                **entry}
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "a") as fh:
            fh.write(json.dumps(line) + "\n")


def _raise_if_never_started(result: dict[str, Any], what: str) -> None:
    tests = result.get("tests", {})
    errors = [t.get("error", "") for t in tests.values()]
    if tests and all(t.get("status") == "not run" for t in tests.values()):
        raise GradingEnvironmentError(f"{what}: the grading kernel never ran a cell: {errors[0]}")


def log_path_for(db_url: str, course_root: str) -> Path:
    """Where the batch log lives: beside a sqlite gradebook, else in the course root."""
    prefix = "sqlite:///"
    if db_url.startswith(prefix):
        return Path(db_url[len(prefix):]).resolve().parent / BATCH_LOG
    return Path(course_root).resolve() / BATCH_LOG


def read_batches(path: Path) -> dict[str, dict[str, Any]]:
    """{batch id: {"seed", "notebooks": [entries]}} from a batch log (empty when there is none)."""
    batches: dict[str, dict[str, Any]] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            if line.strip():
                entry = json.loads(line)
                batches.setdefault(entry["batch"], {"seed": entry["seed"], "notebooks": []})["notebooks"].append(entry)
    return batches
