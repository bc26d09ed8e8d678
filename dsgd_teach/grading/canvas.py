"""A Canvas gradebook export (the roster) read bounded, and each submission folder matched to its student's row.

Canvas's Grades > Export writes a CSV whose first columns are `Student` ("Last, First"), `ID` (Canvas's user id),
`SIS User ID`, `SIS Login ID`, optionally `Integration ID`, and `Section`, then one column per assignment named
`name (assignment id)` and read-only score columns. Rows that are not students carry no `ID`: `    Points Possible`
and, in newer exports, the posting policy row (`Manual Posting`). Its import (Grades > Import) finds each row's
student by `ID`, else `SIS User ID`, else `SIS Login ID`, and fills an existing assignment through a header of the
form `name (assignment id)`.

A submission folder is matched to the one row whose `SIS User ID`, `SIS Login ID` (letter case ignored) or `ID`
equals the folder's name; a folder that names no row, or two different rows, is unmatched, and so is a row that no
folder names. The export file is the TA's, but it is read as any other input: at most MAX_BYTES, at most MAX_ROWS
rows of at most MAX_COLUMNS fields, UTF-8 (a byte-order mark allowed).
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass, field
from pathlib import Path

from .safeio import read_regular

MAX_BYTES = 32 * 1024 * 1024
MAX_ROWS = 100_000
MAX_COLUMNS = 5_000
IDENTITY = ("Student", "ID", "SIS User ID", "SIS Login ID", "Section")
KEYS = ("SIS User ID", "SIS Login ID", "ID")  # what a folder may be named by, in the order tried
_HEADER_ID = re.compile(r"^(?P<name>.*\S)\s+\((?P<id>\d+)\)$")


@dataclass(frozen=True)
class Student:
    """One student's row of the gradebook export: the identity columns Canvas's import reads."""

    name: str
    canvas_id: str
    sis_user_id: str
    sis_login_id: str
    section: str

    def key(self, column: str) -> str:
        return {"SIS User ID": self.sis_user_id, "SIS Login ID": self.sis_login_id.casefold(),
                "ID": self.canvas_id}[column]


@dataclass
class Roster:
    """The students of a gradebook export and its assignment columns ({assignment name: header})."""

    students: list[Student]
    columns: dict[str, str] = field(default_factory=dict)


@dataclass
class Match:
    """Folder name -> the student's row; rows no folder named; folders that named no row (or several), and why."""

    found: dict[str, Student]
    students_without_folder: list[Student]
    folders_without_student: dict[str, str]


def read_roster(path: Path) -> Roster:
    """The students and assignment columns of a Canvas gradebook export; ValueError says what is wrong with it."""
    data = read_regular(path, MAX_BYTES)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path.name} is not UTF-8 text (byte {exc.start})") from None
    rows = csv.reader(io.StringIO(text, newline=""))
    header = next(rows, None)
    if header is None:
        raise ValueError(f"{path.name} is empty")
    header = [h.strip() for h in header]
    missing = [c for c in IDENTITY if c not in header]
    if missing:
        raise ValueError(f"{path.name} is not a Canvas gradebook export: no column {', '.join(map(repr, missing))}")
    if len(header) > MAX_COLUMNS:
        raise ValueError(f"{path.name} has more than {MAX_COLUMNS} columns")
    at = {c: header.index(c) for c in IDENTITY}
    students = []
    for number, row in enumerate(rows, start=2):
        if number > MAX_ROWS + 1:
            raise ValueError(f"{path.name} has more than {MAX_ROWS} rows")
        if len(row) > MAX_COLUMNS:
            raise ValueError(f"{path.name}, row {number}: more than {MAX_COLUMNS} fields")
        cells = {c: (row[i].strip() if i < len(row) else "") for c, i in at.items()}
        if not cells["ID"] or cells["Student"] == "Points Possible":
            continue  # Points Possible, the posting policy row, blank lines
        students.append(Student(cells["Student"], cells["ID"], cells["SIS User ID"], cells["SIS Login ID"],
                                cells["Section"]))
    columns = {}
    for h in header:
        m = _HEADER_ID.match(h)
        if m and m["name"] not in columns:
            columns[m["name"]] = h
    return Roster(students, columns)


def match(folders: list[str], roster: Roster) -> Match:
    """Each folder's row by SIS User ID, SIS Login ID (any letter case) or ID; unmatched on both sides, with why."""
    index: dict[str, dict[str, list[Student]]] = {c: {} for c in KEYS}
    for s in roster.students:
        for column in KEYS:
            if s.key(column):
                index[column].setdefault(s.key(column), []).append(s)
    found: dict[str, Student] = {}
    unmatched: dict[str, str] = {}
    for folder in sorted(set(folders)):
        hits = {column: index[column].get(folder.casefold() if column == "SIS Login ID" else folder, [])
                for column in KEYS}
        rows = {s for column in KEYS for s in hits[column]}
        if len(rows) == 1:
            found[folder] = rows.pop()
        elif rows:
            names = "; ".join(sorted(f"{s.name} (ID {s.canvas_id})" for s in rows))[:300]
            unmatched[folder] = f"names {len(rows)} students of the roster: {names}"
        else:
            unmatched[folder] = "no roster row has this SIS User ID, SIS Login ID or ID"
    named = {id(s) for s in found.values()}
    return Match(found, [s for s in roster.students if id(s) not in named], unmatched)
