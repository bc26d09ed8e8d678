"""Grades in the formats learning-management systems import: Gradescope's results.json and a Canvas gradebook CSV.

* **Gradescope** (autograder specification, https://gradescope-autograders.readthedocs.io/en/latest/specs/): one
  `results.json` per submission, `gradescope/<assignment>/<student>/results.json`, with the total `score`, an
  `output` for the whole submission and one entry in `tests` per question (`name`, `number`, `score`, `max_score`,
  `status`, `output`, `visibility`). Reasons are the grader's cleaned sentences (hidden checks in words only);
  integrity flags go to `extra_data`, which Gradescope stores for the instructor without showing it.
* **Canvas** (Grades > Import, a CSV in the layout of Canvas's own gradebook export): `canvas_grades.csv` with the
  columns `Student`, `ID`, `SIS User ID`, `SIS Login ID`, `Section`, then one column per assignment holding the
  student's total; the second row is `Points Possible`. Canvas matches a row by `ID`, else `SIS User ID`, else
  `SIS Login ID`: the student's folder name goes into both SIS columns (name the folders by SIS id), `ID` is left
  empty. A new column name creates a new assignment in Canvas; rename the header to `name (canvas id)` to fill an
  existing one. Cells that a spreadsheet would read as a formula are prefixed with `'`.
  With a roster (`--roster`, a gradebook export of the course, `canvas.py`) each folder is matched to its
  student's row: the identity columns are that row's, an assignment the roster already has is written under its
  `name (canvas id)` header, and `canvas_unmatched.csv` lists the folders and the students left unmatched.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

from .canvas import Roster, match
from .safeio import write_atomic
from .text import clean
from .verdict import Grade

FORMATS = ("gradescope", "canvas")
CANVAS_FILE = "canvas_grades.csv"
CANVAS_UNMATCHED = "canvas_unmatched.csv"
CANVAS_IDENTITY = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
CANVAS_POINTS_ROW = "Points Possible"
GRADESCOPE_VISIBILITY = ("hidden", "after_due_date", "after_published", "visible")
INTEGRITY = "(integrity)"
SKIPPED = "(skipped)"


class Graded(Protocol):
    student: str
    assignment: str
    grades: list[Grade]


def _questions(grades: Iterable[Grade]) -> list[Grade]:
    return [g for g in grades if g.question not in (INTEGRITY, SKIPPED)]


def gradescope_results(sub: Graded, *, visibility: str = "visible") -> dict[str, Any]:
    """One submission's results.json document (Gradescope's autograder output format)."""
    if visibility not in GRADESCOPE_VISIBILITY:
        raise ValueError(f"visibility must be one of {GRADESCOPE_VISIBILITY}")
    questions = _questions(sub.grades)
    flags = [clean(g.reason) for g in sub.grades if g.question == INTEGRITY]
    tests = []
    for number, g in enumerate(questions, start=1):
        tests.append({
            "name": clean(g.question, 200), "number": str(number), "score": float(g.points),
            "max_score": float(g.max_points), "status": "passed" if g.points >= g.max_points else "failed",
            "output": clean(g.reason), "visibility": visibility,
        })
    total, best = sum(g.points for g in questions), sum(g.max_points for g in questions)
    doc: dict[str, Any] = {
        "score": float(total),
        "output": clean(f"{sub.assignment}: {total:g} / {best:g} points, graded by dsgd-teach"
                        + (" (flagged for review by the instructor)" if flags else ""), 400),
        "visibility": visibility, "stdout_visibility": "hidden", "tests": tests,
    }
    if flags:
        doc["extra_data"] = {"flags": flags}
    return doc


def _cell(text: object) -> str:
    value = clean(text, 200)
    return "'" + value if value[:1] in ("=", "+", "-", "@", "\t", "\r") else value


def canvas_csv(subs: Iterable[Graded], roster: Roster | None = None) -> str:
    """A Canvas gradebook import CSV: one row per student, one column per assignment (the total points).

    With a roster, one row per folder matched to a student of it (that student's identity columns)."""
    totals: dict[str, dict[str, float]] = {}
    possible: dict[str, float] = {}
    for sub in subs:
        questions = _questions(sub.grades)
        if sub.assignment == SKIPPED or not questions:
            totals.setdefault(sub.student, {})
            continue
        totals.setdefault(sub.student, {})[sub.assignment] = sum(g.points for g in questions)
        possible[sub.assignment] = max(possible.get(sub.assignment, 0.0), sum(g.max_points for g in questions))
    assignments = sorted(possible)
    buf = io.StringIO(newline="")
    writer = csv.writer(buf, lineterminator="\r\n")
    headers = [roster.columns.get(a, a) if roster is not None else a for a in assignments]
    writer.writerow(CANVAS_IDENTITY + [_cell(h) for h in headers])
    writer.writerow([CANVAS_POINTS_ROW, "", "", "", ""] + [f"{possible[a]:g}" for a in assignments])
    if roster is not None:
        found = match(list(totals), roster).found
        for folder, s in sorted(found.items(), key=lambda kv: (kv[1].name, kv[0])):
            writer.writerow([_cell(s.name), _cell(s.canvas_id), _cell(s.sis_user_id), _cell(s.sis_login_id),
                             _cell(s.section)]
                            + [f"{totals[folder][a]:g}" if a in totals[folder] else "" for a in assignments])
        return buf.getvalue()
    for student in sorted(totals):
        name = _cell(student)
        writer.writerow([name, "", name, name, ""]
                        + [f"{totals[student][a]:g}" if a in totals[student] else "" for a in assignments])
    return buf.getvalue()


def gradescope_path(sub: Graded) -> str:
    return f"gradescope/{sub.assignment}/{sub.student}/results.json"


def canvas_unmatched_csv(subs: Iterable[Graded], roster: Roster) -> str:
    """The folders that matched no student of the roster and the students no folder matched, one row each."""
    m = match([sub.student for sub in subs], roster)
    buf = io.StringIO(newline="")
    writer = csv.writer(buf, lineterminator="\r\n")
    writer.writerow(["kind", "folder", "Student", "ID", "SIS User ID", "SIS Login ID", "Section", "why"])
    for folder, why in sorted(m.folders_without_student.items()):
        writer.writerow(["folder", _cell(folder), "", "", "", "", "", _cell(why)])
    for s in m.students_without_folder:
        writer.writerow(["student", "", _cell(s.name), _cell(s.canvas_id), _cell(s.sis_user_id),
                         _cell(s.sis_login_id), _cell(s.section), "no submission folder names this student"])
    return buf.getvalue()


def export(out_dir: Path, subs: list[Graded], formats: Iterable[str], roster: Roster | None = None) -> list[str]:
    """Write the requested formats under out_dir (atomically, no link followed); returns the paths written.

    roster: a Canvas gradebook export (canvas.read_roster) to match folders to students for the canvas format."""
    written = []
    out_dir.mkdir(parents=True, exist_ok=True)
    for fmt in dict.fromkeys(formats):
        if fmt == "gradescope":
            for sub in subs:
                if sub.assignment == SKIPPED or not _questions(sub.grades):
                    continue
                path = gradescope_path(sub)
                write_atomic(out_dir, path, json.dumps(gradescope_results(sub), indent=2).encode())
                written.append(path)
        elif fmt == "canvas":
            write_atomic(out_dir, CANVAS_FILE, canvas_csv(subs, roster).encode("utf-8"))
            written.append(CANVAS_FILE)
            if roster is not None:
                write_atomic(out_dir, CANVAS_UNMATCHED, canvas_unmatched_csv(subs, roster).encode("utf-8"))
                written.append(CANVAS_UNMATCHED)
        else:
            raise ValueError(f"unknown export format {fmt!r}; known: {', '.join(FORMATS)}")
    return written
