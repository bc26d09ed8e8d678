"""Find a class's submissions without following links or opening FIFOs, and match each notebook to its assignment."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import nbread, safeio
from .notebook import Assignment, nbgrader_meta
from .verdict import Grade

SKIPPED = "(skipped)"


@dataclass
class Submission:
    """One student's notebook for one assignment (path None when nothing was handed in)."""

    student: str
    assignment: str
    path: Path | None
    grades: list[Grade] = field(default_factory=list)
    note: str = ""  # why nothing was graded (e.g. the notebook was a symlink or a FIFO)


def find_submissions(root: Path, assignments: dict[str, Assignment], only: str | None) -> list[Submission]:
    """Submissions under root: <student>/[<assignment>/]*.ipynb or <student>.ipynb (one assignment per notebook).

    Only regular files and real folders are considered (lstat, never opened while listing, so a FIFO cannot
    block); anything else (symlink, FIFO, socket, device) is skipped and reported as a "(skipped)" submission.
    """
    found: dict[tuple[str, str], Submission] = {}
    students: list[str] = []
    skipped: dict[str, list[str]] = {}
    for entry in sorted(root.iterdir()):
        what = safeio.lstat_kind(entry)
        if entry.name.startswith("."):
            continue
        if what == "folder":
            notebooks, bad = _walk(entry)
            student = entry.name
        elif what == "regular file" and entry.suffix == ".ipynb":
            notebooks, bad, student = [entry], [], entry.stem
        elif what == "regular file":
            continue
        else:
            notebooks, bad, student = [], [f"{entry.name} is a {what}"], entry.name.split(".")[0] or entry.name
        students.append(student)
        if bad:
            skipped.setdefault(student, []).extend(bad)
        for nb_path in notebooks:
            name = _which_assignment(nb_path, assignments)
            if name and (only is None or name == only) and (student, name) not in found:
                found[(student, name)] = Submission(student, name, nb_path)
    for student, bad in skipped.items():
        note = "skipped (not a regular file or folder): " + "; ".join(bad[:10])
        if only is not None and (student, only) not in found:
            found[(student, only)] = Submission(student, only, None, note=note)
        else:
            found[(student, SKIPPED)] = Submission(student, SKIPPED, None, note=note)
    if only is not None:
        for student in students:
            found.setdefault((student, only), Submission(student, only, None))
    return sorted(found.values(), key=lambda s: (s.assignment, s.student))


def _walk(folder: Path) -> tuple[list[Path], list[str]]:
    """A student folder's regular *.ipynb files, and every entry that is neither a regular file nor a folder."""
    notebooks, bad = [], []
    for here, dirs, files in os.walk(folder, followlinks=False):
        dirs[:] = sorted(d for d in dirs if d != ".ipynb_checkpoints")
        for name in sorted(files) + [d for d in dirs if os.path.islink(os.path.join(here, d))]:
            path = Path(here) / name
            what = safeio.lstat_kind(path)
            if what == "regular file":
                if name.endswith(".ipynb"):
                    notebooks.append(path)
            elif what != "folder":
                bad.append(f"{path.relative_to(folder.parent)} is a {what}")
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(here, d))]
    return notebooks, bad


def read_notebook(path: Path) -> Any:
    """A submitted notebook (a regular file, no link followed), bounded and parsed in a memory-capped child."""
    return nbread.read(path)


def _which_assignment(path: Path, assignments: dict[str, Assignment]) -> str | None:
    for part in (path.parent.name, path.stem):
        if part in assignments:
            return part
    try:
        nb = read_notebook(path)
    except Exception:  # noqa: BLE001 - unreadable notebooks are matched by name only
        return None
    ids = {str(nbgrader_meta(c).get("grade_id")) for c in nb.cells}
    best = max(assignments.values(), key=lambda a: len(ids & {q.grade_id for q in a.questions}), default=None)
    return best.name if best and ids & {q.grade_id for q in best.questions} else None
