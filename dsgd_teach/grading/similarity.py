"""`dsgd-teach similarity SUBMISSIONS_DIR`: the most similar pairs of solution cells per question, HTML and CSV.

The detector is copydetect (https://github.com/blingenf/copydetect), an implementation of the winnowing algorithm
of Schleimer, Wilkerson & Aiken, "Winnowing: local algorithms for document fingerprinting", SIGMOD 2003, on which
MOSS is built. Each solution cell (matched to its question by nbgrader `grade_id`) is tokenized with Pygments,
names become `V`/`F`/`O`, strings `S` and comments vanish, so renaming variables or rewriting comments changes
nothing; every k-gram of NOISE characters of that text is hashed (window 1: all of them are kept, so the result
does not depend on Python's per-process string hashes), and the k-grams of the released template of that cell
(the source with each `### BEGIN SOLUTION ... ### END SOLUTION` region replaced by nbgrader's stub) are dropped.
A pair's similarity is the larger of the two shares of each cell's remaining k-grams found in the other.

Submissions are hostile input: every notebook is read by `nbread` (bounded, parsed in a memory-capped child), each
cell is cut to MAX_CELL characters before it is tokenized, and every name and line of code that reaches the HTML is
escaped; the outputs are written atomically (`safeio`). A high score is a reason to read the pair, not a verdict.
"""

from __future__ import annotations

import csv
import html
import io
import itertools
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .notebook import Assignment, find_assignments, load_assignment, nbgrader_meta
from .safeio import write_atomic
from .submissions import find_submissions, read_notebook
from .text import clean

NOISE = 25  # copydetect's noise threshold: the shortest match (in filtered characters) that counts
MAX_CELL = 64 * 1024  # characters of one solution cell that are compared
CSV_FILE, HTML_FILE = "similarity.csv", "similarity.html"
CSV_FIELDS = ["assignment", "question", "rank", "student_a", "student_b", "similarity", "share_a", "share_b",
              "overlap_chars"]
STUB = "# YOUR CODE HERE\nraise NotImplementedError()"
_SOLUTION = re.compile(r"^([ \t]*)### BEGIN SOLUTION.*?### END SOLUTION[^\n]*", re.S | re.M)


@dataclass(frozen=True)
class Pair:
    """Two students' cells for one question, how much of each the other contains, and where."""

    assignment: str
    question: str
    student_a: str
    student_b: str
    share_a: float
    share_b: float
    overlap: int
    code_a: str = field(repr=False)
    code_b: str = field(repr=False)
    slices_a: Any = field(repr=False)  # copydetect's [starts, ends] of the shared regions in code_a
    slices_b: Any = field(repr=False)

    @property
    def similarity(self) -> float:
        return max(self.share_a, self.share_b)

    def marked(self) -> tuple[str, str]:
        """Both cells as escaped HTML with the shared regions in <mark> (made only for the pairs shown)."""
        return _marked(self.code_a, self.slices_a), _marked(self.code_b, self.slices_b)


def template(source: str) -> str:
    """The released version of a solution cell: each solution region replaced by nbgrader's stub."""
    return _SOLUTION.sub(lambda m: "\n".join(m.group(1) + line for line in STUB.splitlines()), source)


def solution_templates(assignment: Assignment) -> dict[str, str]:
    """{solution cell grade_id: its released template} in notebook order."""
    return {str(nbgrader_meta(c)["grade_id"]): template(c.source) for c in assignment.notebook.cells
            if c.cell_type == "code" and nbgrader_meta(c).get("solution") and nbgrader_meta(c).get("grade_id")}


def solution_sources(nb: Any, ids: set[str]) -> dict[str, str]:
    """A submission's code for each solution grade_id (the first cell carrying it), cut to MAX_CELL characters."""
    found: dict[str, str] = {}
    for cell in getattr(nb, "cells", []):
        gid = str(nbgrader_meta(cell).get("grade_id", ""))
        if cell.get("cell_type") == "code" and gid in ids and gid not in found:
            found[gid] = str(cell.get("source", ""))[:MAX_CELL]
    return found


def _fingerprint(code: str, boilerplate: Any) -> Any:
    from copydetect import CodeFingerprint

    return CodeFingerprint("cell.py", NOISE, 1, boilerplate, fp=io.StringIO(code))


def _marked(code: str, slices: Any) -> str:
    from copydetect.utils import highlight_overlap

    if len(slices) == 0 or slices.shape[-1] == 0:
        return html.escape(code)
    return highlight_overlap(code, slices, "<mark>", "</mark>", escape_html=True)[0]


def compare_question(assignment: str, question: str, boilerplate_code: str, cells: dict[str, str]) -> list[Pair]:
    """Every pair of students' cells for one question, most similar first (template k-grams excluded)."""
    import numpy as np
    from copydetect import compare_files

    boilerplate = np.array(sorted(_fingerprint(boilerplate_code, None).hashes))
    prints = {student: _fingerprint(code, boilerplate) for student, code in sorted(cells.items())}
    pairs = []
    for a, b in itertools.combinations(sorted(prints), 2):
        overlap, (share_a, share_b), (slices_a, slices_b) = compare_files(prints[a], prints[b])
        pairs.append(Pair(assignment, question, a, b, float(share_a), float(share_b), int(overlap),
                          cells[a], cells[b], slices_a, slices_b))
    return sorted(pairs, key=lambda p: (-p.similarity, -p.overlap, p.student_a, p.student_b))


def similarity_report(submissions_dir: Path, source_dir: Path, *, assignment: str | None = None,
                      jobs: int = 2) -> tuple[list[Pair], list[str]]:
    """All pairs per question, most similar first, and notes on what could not be compared."""
    sources = find_assignments(source_dir)
    if assignment is not None and assignment not in sources:
        raise ValueError(f"unknown assignment {assignment!r}; known: {', '.join(sources)}")
    assignments = {name: load_assignment(path) for name, path in sources.items()}
    found = find_submissions(submissions_dir, assignments, assignment)
    notes = [f"{clean(s.student, 200)}: not compared, {clean(s.note, 300)}" for s in found if s.note]
    subs = [s for s in found if s.path is not None and s.assignment in assignments]
    templates = {name: solution_templates(a) for name, a in assignments.items()}

    def read(sub: Any) -> dict[str, str] | None:
        try:
            return solution_sources(read_notebook(sub.path), set(templates[sub.assignment]))
        except Exception as exc:  # noqa: BLE001 - an unreadable notebook is left out with the reason
            notes.append(f"{clean(sub.student, 200)} ({sub.assignment}): not compared, {clean(exc, 200)}")
            return None

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        read_all = zip([(s.assignment, s.student) for s in subs], pool.map(read, subs), strict=True)
        cells = {key: got for key, got in read_all if got is not None}
    pairs: list[Pair] = []
    for name in sorted({s.assignment for s in subs}):
        for gid, boilerplate in templates[name].items():
            by_student = {student: found[gid] for (a, student), found in cells.items() if a == name and gid in found}
            missing = sorted(student for (a, student), found in cells.items() if a == name and gid not in found)
            if missing:
                notes.append(f"{name} {gid}: no cell with this grade_id from {', '.join(map(str, missing[:20]))}"
                             + (f" and {len(missing) - 20} more" if len(missing) > 20 else ""))
            pairs += compare_question(name, gid, boilerplate, by_student)
    return pairs, notes


def _csv_cell(text: object) -> str:
    value = clean(text, 200)
    return "'" + value if value[:1] in ("=", "+", "-", "@") else value


def report_csv(pairs: list[Pair], top: int) -> str:
    """The `top` most similar pairs of each question, one row each."""
    buf = io.StringIO(newline="")
    writer = csv.writer(buf)
    writer.writerow(CSV_FIELDS)
    for (name, gid), group in itertools.groupby(pairs, key=lambda p: (p.assignment, p.question)):
        for rank, p in enumerate(itertools.islice(group, top), start=1):
            writer.writerow([_csv_cell(name), _csv_cell(gid), rank, _csv_cell(p.student_a), _csv_cell(p.student_b),
                             f"{p.similarity:.3f}", f"{p.share_a:.3f}", f"{p.share_b:.3f}", p.overlap])
    return buf.getvalue()


def report_html(pairs: list[Pair], notes: list[str], top: int) -> str:
    """A page per batch: for each question its `top` pairs, each cell with the shared regions marked."""
    esc = html.escape
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>Similarity report</title><style>"
             "body{font-family:sans-serif;margin:2em}pre{background:#f6f6f6;padding:.5em;overflow:auto;"
             "max-height:30em}mark{background:#ffd24d}.pair{display:grid;grid-template-columns:1fr 1fr;gap:1em}"
             "</style></head><body><h1>Similarity of solution cells</h1>"
             f"<p>copydetect (winnowing, MOSS's algorithm), k = {NOISE} filtered characters, the released template "
             "excluded. A high score is a reason to read the pair, not a verdict.</p>"]
    if notes:
        parts.append("<h2>Not compared</h2><ul>" + "".join(f"<li>{esc(clean(n))}</li>" for n in notes) + "</ul>")
    for (name, gid), group in itertools.groupby(pairs, key=lambda p: (p.assignment, p.question)):
        parts.append(f"<h2>{esc(clean(name, 200))}: {esc(clean(gid, 200))}</h2>")
        for rank, p in enumerate(itertools.islice(group, top), start=1):
            a, b = esc(clean(p.student_a, 200)), esc(clean(p.student_b, 200))
            marked_a, marked_b = p.marked()
            parts.append(f"<h3>{rank}. {a} and {b}: {p.similarity:.0%}</h3><div class='pair'>"
                         f"<div><b>{a}</b> ({p.share_a:.0%} of it found in the other)<pre>{marked_a}</pre></div>"
                         f"<div><b>{b}</b> ({p.share_b:.0%})<pre>{marked_b}</pre></div></div>")
    parts.append("</body></html>")
    return "".join(parts)


def write_report(out_dir: Path, pairs: list[Pair], notes: list[str], top: int = 20) -> list[str]:
    """similarity.csv and similarity.html under out_dir (atomically, no link followed); returns the names."""
    out_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(out_dir, CSV_FILE, report_csv(pairs, top).encode("utf-8"))
    write_atomic(out_dir, HTML_FILE, report_html(pairs, notes, top).encode("utf-8"))
    return [CSV_FILE, HTML_FILE]


def main(argv: list[str]) -> int:
    """`dsgd-teach similarity SUBMISSIONS_DIR [--out DIR] [--top N]`; 0 when the report was written, 2 on an error."""
    import argparse
    import sys

    from .paths import default_source_dir
    from .safeio import UnsafeOutput

    p = argparse.ArgumentParser(prog="dsgd-teach similarity",
                                description="Report the most similar pairs of solution cells per question.")
    p.add_argument("submissions", type=Path, help="folder of <student>/[<assignment>/]*.ipynb or <student>.ipynb")
    p.add_argument("--assignment", help="only this assignment (e.g. ps01_sgd)")
    p.add_argument("--out", type=Path, default=Path("similarity"), help="where similarity.csv and .html go")
    p.add_argument("--source", type=Path, default=None, help="assignment sources (default: course/assignments/source)")
    p.add_argument("--top", type=int, default=20, help="pairs shown per question (default 20)")
    p.add_argument("--jobs", type=int, default=2, help="notebooks read at once (default 2)")
    args = p.parse_args(argv)
    source = args.source or default_source_dir()
    if not args.submissions.is_dir() or source is None or not source.is_dir():
        print("error: pass a submissions folder (and --source DIR if the sources are not found)", file=sys.stderr)
        return 2
    try:
        import copydetect  # noqa: F401 - the detector; in the dev extra
    except ImportError:
        print("error: the similarity report needs copydetect: pip install copydetect (or dsgd-teach[dev])",
              file=sys.stderr)
        return 2
    if args.top < 1:
        print("error: --top must be at least 1", file=sys.stderr)
        return 2
    try:
        pairs, notes = similarity_report(args.submissions, source, assignment=args.assignment, jobs=args.jobs)
        written = write_report(args.out, pairs, notes, args.top)
    except (ValueError, OSError, UnsafeOutput) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for note in notes:
        print(f"note: {clean(note)}", file=sys.stderr)
    print(f"compared {len(pairs)} pair(s) of cells -> {', '.join(str(args.out / w) for w in written)}")
    return 0
