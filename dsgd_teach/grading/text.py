"""Make text a student's process produced safe for a TA's files: bounded, one line, valid UTF-8, no hidden tests.

`clean` cuts text to a limit, replaces lone surrogates and escapes control characters (newlines included) and
bidirectional overrides, so a reason is one short, valid line in grades.csv and on a feedback page. `Redactor` refuses
any text that quotes a line of a hidden test (as written in the source or as rewritten for the student's kernel) or
the batch's seed: a submission can read the running test cell from its own kernel and report it as an "error".
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

from .notebook import HIDDEN_BEGIN, HIDDEN_END, Assignment, hidden_line_numbers, rewrite_test
from .verdict import Grade

REASON_LIMIT = 400
MIN_SECRET = 12  # shorter code lines ("else:", "return w") are too common to mean a leak
REDACTED = "(the reported text was withheld: it quoted hidden test code or the batch's seed)"
_BIDI = {0x200E, 0x200F, 0x061C} | set(range(0x202A, 0x202F)) | set(range(0x2066, 0x206A))
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_SPACE = re.compile(r"\s+")


def _escape(ch: str) -> str:
    if ch in _NAMED:
        return _NAMED[ch]
    if unicodedata.category(ch) in ("Cc", "Cs", "Zl", "Zp") or ord(ch) in _BIDI:
        return f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}"
    return ch


def clean(text: object, limit: int = REASON_LIMIT, *, escape: bool = True) -> str:
    """text as valid UTF-8 of at most limit characters; with escape, also one line without control characters."""
    if not isinstance(text, str):
        try:
            text = str(text)
        except Exception:  # noqa: BLE001 - an object whose formatting fails is shown as its type
            text = f"<{type(text).__name__}>"
    text = text[: limit * 4 + 16]  # bound the work before escaping
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if escape:
        text = text if text.isprintable() else "".join(_escape(ch) for ch in text)
    if len(text) > limit:
        text = text[: max(0, limit - 14)] + " ... (cut)"
    return text


def _squash(text: str) -> str:
    return _SPACE.sub("", text)


def hidden_lines(source: str) -> list[str]:
    """The lines of a test cell's hidden blocks, as written and as rewritten for the student's kernel."""
    hidden = hidden_line_numbers(source)
    lines, kept = [], []
    for number, line in enumerate(source.splitlines(), start=1):
        if number in hidden:
            lines.append(line)
        elif HIDDEN_BEGIN not in line and HIDDEN_END not in line:
            kept.append(line)
    if not lines:
        return []
    try:  # the rewritten cell's lines that the visible part alone does not produce
        visible = set(rewrite_test("\n".join(kept), "student").splitlines())
        lines += [ln for ln in rewrite_test(source, "student").splitlines() if ln not in visible]
    except (SyntaxError, ValueError):
        pass
    return lines


@dataclass(frozen=True)
class Redactor:
    """Withholds text quoting a hidden test's code or the batch's seed."""

    secrets: tuple[str, ...]
    seed: str

    @classmethod
    def for_assignment(cls, assignment: Assignment, seed: int) -> Redactor:
        """The secrets of one assignment's hidden tests, whitespace removed, and the seed."""
        found = {_squash(ln) for q in assignment.questions for ln in hidden_lines(q.source)}
        return cls(tuple(sorted(s for s in found if len(s) >= MIN_SECRET)), str(seed))

    def leaks(self, text: str) -> bool:
        """True when text quotes a hidden line (whitespace and escaping ignored) or the seed (4+ digits) as a number."""
        flat = _squash(text)
        unescaped = _squash(text.replace("\\n", "\n").replace("\\t", "\t").replace("\\r", "\r"))
        if len(self.seed) >= 4 and re.search(rf"(?<!\d){re.escape(self.seed)}(?!\d)", text):
            return True
        return any(s in flat or s in unescaped for s in self.secrets)

    def __call__(self, text: str) -> str:
        """text, or a note that it was withheld."""
        return REDACTED if self.leaks(text) else text


def safe_grades(grades: list[Grade], redactor: Redactor) -> list[Grade]:
    """Grades whose reasons are cleaned and redacted; a withheld reason flags the submission."""
    out = [Grade(clean(g.question, 200), g.points, g.max_points, clean(redactor(clean(g.reason, 4000)))) for g in grades]
    if any(g.reason == REDACTED for g in out):
        rest = [g for g in out if g.question == "(integrity)" and g.reason != REDACTED]
        note = "FLAGGED: a report quoted hidden test code or the batch's seed" + (
            "; " + rest[0].reason.removeprefix("FLAGGED: ") if rest else "")
        out = [g for g in out if g.question != "(integrity)"] + [Grade("(integrity)", 0.0, 0.0, clean(note))]
    return out
