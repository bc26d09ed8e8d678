"""Per-student feedback pages: a table of questions, points and the reason for each."""

from __future__ import annotations

from html import escape
from pathlib import Path

from .safeio import write_atomic
from .text import clean
from .verdict import Grade

UNSAFE_BANNER = ("<p style='background:#fdecea;padding:.6em;border:2px solid #c00'><b>Graded without an OS sandbox"
                 "</b> (--unsafe-no-sandbox): these grades are not protected against a hostile class.</p>")


def write_feedback(path: Path, student: str, assignment: str, grades: list[Grade], *, unsafe: bool = False,
                   root: Path | None = None) -> None:
    """Write a self-contained HTML page for one student's assignment (atomically; no link below root followed)."""
    root = root if root is not None else path.parent
    root.mkdir(parents=True, exist_ok=True)
    total = sum(g.points for g in grades)
    best = sum(g.max_points for g in grades)
    rows = "\n".join(
        f"<tr class='{'ok' if g.points == g.max_points else 'bad'}'><td>{escape(clean(g.question, 200))}</td>"
        f"<td>{g.points:g} / {g.max_points:g}</td><td><pre>{escape(clean(g.reason))}</pre></td></tr>"
        for g in grades
    )
    page = (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{escape(clean(assignment, 200))}: {escape(clean(student, 200))}</title><style>"
        "body{font-family:sans-serif;margin:2em} table{border-collapse:collapse} td,th{border:1px solid #ccc;"
        "padding:.4em;vertical-align:top} tr.ok{background:#eefbea} tr.bad{background:#fdecea}"
        "pre{white-space:pre-wrap;margin:0}</style></head><body>"
        f"<h1>{escape(clean(assignment, 200))}</h1>{UNSAFE_BANNER if unsafe else ''}<p>Student: <b>{escape(clean(student, 200))}</b> &mdash; score "
        f"<b>{total:g} / {best:g}</b></p><table><tr><th>question</th><th>points</th><th>feedback</th></tr>"
        f"{rows}</table><p>Checks on hidden inputs that fail are described in words (what they expect, what your code "
        "gave); those inputs and the expected values are not shown. Run the visible tests in your notebook for details.</p>"
        "</body></html>"
    )
    write_atomic(root, str(path.relative_to(root)), page.encode())
