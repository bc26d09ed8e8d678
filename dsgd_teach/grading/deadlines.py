"""Due dates, late penalties and per-student extensions, applied to a graded submission as one "(deadline)" row.

A submission is late by the number of started days (24 h each) past its due date, where the due date is the
assignment's plus the student's extension. The policy either takes `penalty_per_day` (a fraction of the points
earned, per started day, never more than those points) or, past `cutoff_days` after the due date, all of them.
On time, the row says so with 0 points; late, its points are minus the deduction. grades.csv, the feedback page,
the Canvas total and Gradescope's score all add that row.
"""

from __future__ import annotations

import csv
import io
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

from .verdict import Grade

ROW = "(deadline)"
DAY = timedelta(days=1)
MAX_EXTENSIONS_BYTES = 1 << 20
TIMESTAMP_FILE = "timestamp.txt"  # nbgrader's exchange writes the submission time here


def parse_time(text: str, what: str = "time") -> datetime:
    """An ISO 8601 time with a UTC offset (Z accepted), or nbgrader's '%Y-%m-%d %H:%M:%S.%f UTC'; else ValueError."""
    raw = str(text).strip()
    if raw.endswith(" UTC"):
        raw = raw[:-4] + "+00:00"
    try:
        when = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{what} must be an ISO 8601 time such as 2026-12-01T23:59:00+00:00, got {text!r}") from None
    if when.tzinfo is None:
        raise ValueError(f"{what} must carry a UTC offset (e.g. +00:00 or Z), got {text!r}")
    return when


@dataclass(frozen=True)
class LatePolicy:
    """A due date, a penalty per started day late or a cut-off, and extra days per student."""

    due: datetime
    penalty_per_day: float = 0.0
    cutoff_days: float | None = None
    extensions: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.due.tzinfo is None:
            raise ValueError("due must carry a UTC offset")
        if not 0.0 <= self.penalty_per_day <= 1.0:
            raise ValueError(f"penalty_per_day must be in [0, 1] (a fraction per day), got {self.penalty_per_day}")
        if self.cutoff_days is not None and not 0.0 <= self.cutoff_days <= 3650:
            raise ValueError(f"cutoff_days must be in [0, 3650], got {self.cutoff_days}")
        for student, days in self.extensions.items():
            if not 0.0 <= days <= 3650:
                raise ValueError(f"extension of {student!r} must be in [0, 3650] days, got {days}")

    def due_for(self, *keys: str) -> tuple[datetime, float]:
        """The student's due date (the first of keys with an extension) and the extension's days."""
        days = next((self.extensions[k] for k in keys if k in self.extensions), 0.0)
        return self.due + timedelta(days=days), days

    def days_late(self, submitted: datetime, *keys: str) -> int:
        """Started days past the student's due date (0 when on time)."""
        due, _ = self.due_for(*keys)
        return max(0, math.ceil((submitted - due) / DAY))

    def row(self, earned: float, submitted: datetime, *keys: str) -> Grade:
        """The "(deadline)" row for a submission that earned `earned` points before any penalty."""
        due, extra = self.due_for(*keys)
        when = f"due {due.astimezone(timezone.utc):%Y-%m-%d %H:%M} UTC" + (
            f" (with an extension of {extra:g} day(s))" if extra else "")
        late = self.days_late(submitted, *keys)
        if not late:
            return Grade(ROW, 0.0, 0.0, f"submitted on time, {when}")
        if self.cutoff_days is not None and submitted > due + timedelta(days=self.cutoff_days):
            return Grade(ROW, -earned, 0.0, f"submitted {late} day(s) late, past the cut-off of {self.cutoff_days:g} "
                                             f"day(s) after the {when}: no points")
        cut = min(earned, round(earned * self.penalty_per_day * late, 2))
        return Grade(ROW, -cut, 0.0, f"submitted {late} day(s) late, {when}: {self.penalty_per_day:.0%} per day of "
                                     f"the {earned:g} points earned = -{cut:g}")

    def apply(self, grades: list[Grade], submitted: datetime, *keys: str) -> list[Grade]:
        """grades with the deadline row appended (any earlier one replaced)."""
        kept = [g for g in grades if g.question != ROW]
        earned = sum(g.points for g in kept if g.points > 0)
        return kept + [self.row(earned, submitted, *keys)]


def read_extensions(text: str) -> dict[str, float]:
    """Extra days per student from a CSV with the columns `student` and `days`; a bad row raises ValueError
    naming its line."""
    if len(text) > MAX_EXTENSIONS_BYTES:
        raise ValueError("the extensions file is larger than 1 MB")
    rows = csv.DictReader(io.StringIO(text))
    if not rows.fieldnames or {"student", "days"} - {f.strip() for f in rows.fieldnames}:
        raise ValueError("the extensions CSV needs the columns student,days")
    out: dict[str, float] = {}
    for number, row in enumerate(rows, start=2):
        student, days = (row.get("student") or "").strip(), (row.get("days") or "").strip()
        try:
            value = float(days)
        except ValueError:
            raise ValueError(f"extensions line {number}: days must be a number, got {days!r}") from None
        if not student or not math.isfinite(value) or not 0 <= value <= 3650:
            raise ValueError(f"extensions line {number}: need a student and days in [0, 3650], got {row!r}")
        if student in out:
            raise ValueError(f"extensions line {number}: {student!r} is listed twice")
        out[student] = value
    return out


def load_policy(due: str, penalty_per_day: float = 0.0, cutoff_days: float | None = None,
                extensions_csv: Path | None = None) -> LatePolicy:
    """A LatePolicy from the command line's strings (the extensions file read bounded)."""
    ext = {}
    if extensions_csv is not None:
        with open(extensions_csv, "rb") as fh:
            ext = read_extensions(fh.read(MAX_EXTENSIONS_BYTES + 1).decode("utf-8-sig"))
    return LatePolicy(parse_time(due, "due"), penalty_per_day, cutoff_days, ext)


def submitted_at(notebook: Path | None) -> datetime:
    """When a notebook was handed in: nbgrader's timestamp.txt beside it (a regular file), else its mtime (UTC)."""
    if notebook is None:
        return datetime.now(timezone.utc)
    stamp = notebook.parent / TIMESTAMP_FILE
    try:
        fd = os.open(stamp, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        try:
            text = os.read(fd, 200).decode("utf-8", "replace") if os.path.isfile(stamp) else ""
        finally:
            os.close(fd)
        if text.strip():
            return parse_time(text, str(stamp))
    except (OSError, ValueError):
        pass
    return datetime.fromtimestamp(os.lstat(notebook).st_mtime, timezone.utc)


def keys_of(names: Iterable[object]) -> tuple[str, ...]:
    """Extension keys of a student: each identity as text, blanks dropped."""
    return tuple(str(n) for n in names if n not in (None, ""))
