"""Check each cell's nbgrader metadata before nbgrader does: a bad one is that submission's problem, never the run's.

nbgrader raises SchemaTooOldError / SchemaTooNewError from `CheckCellMetadata` (nbgraderformat/common.py,
`validate_cell`), and its `convert_notebooks` turns those two into an NbGraderException that ends the whole
autograde run; other validation errors fail that student's notebook with a traceback and exit 1 at the end. Its
`DeduplicateIds` empties the metadata of all but the last copy of a cell pasted twice, which then fails as
schema version 0. So before any of nbgrader's preprocessors run, every cell whose nbgrader metadata breaks
schema 3 (types, keys, versions, required ids and points), names a grade id the source notebook does not have or
has for another cell type, or repeats a grade id already seen, loses its nbgrader metadata: it is graded as an
ordinary cell of the student's (the route restores every test cell from the source anyway), and the reason is
kept for that submission's comments.
"""

from __future__ import annotations

import re
from typing import Any

SCHEMA_VERSION = 3
TYPES = {"schema_version": int, "grade": bool, "locked": bool, "solution": bool, "task": bool, "grade_id": str,
         "points": (int, float), "checksum": str, "cell_type": str}
REQUIRED = ("schema_version", "grade", "locked", "solution")
_GRADE_ID = re.compile(r"^[a-zA-Z0-9_\-]*$")


def known_cells(source_nb: Any) -> dict[str, str]:
    """{grade_id: cell type} of the source notebook's nbgrader cells (graded, solution, locked or task)."""
    known = {}
    for cell in source_nb.cells:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if isinstance(meta, dict) and any(meta.get(k) for k in ("grade", "solution", "locked", "task")):
            known[str(meta.get("grade_id", ""))] = cell.get("cell_type", "")
    return known


def problem(meta: Any, cell_type: str, known: dict[str, str], seen: set[str]) -> str:
    """Why this cell's nbgrader metadata cannot be given to nbgrader ('' when it can); records its id in seen."""
    if not isinstance(meta, dict):
        return f"its nbgrader metadata is a {type(meta).__name__}"
    if "dsgd_invalid" in meta:  # the reading child's marker (sanitize.py): nested or oversized metadata
        return str(meta["dsgd_invalid"])[:200]
    version = meta.get("schema_version", 0)
    if type(version) is not int or version != SCHEMA_VERSION:
        return f"nbgrader metadata of schema version {str(version)[:20]} (this course uses {SCHEMA_VERSION})"
    extra = sorted(str(k)[:40] for k in meta if k not in TYPES)
    if extra:
        return f"unknown nbgrader metadata keys {extra[:3]}"
    missing = [k for k in REQUIRED if k not in meta]
    if missing:
        return f"nbgrader metadata without {', '.join(missing)}"
    for key, value in meta.items():
        if isinstance(value, bool) and TYPES[key] is not bool or not isinstance(value, TYPES[key]):
            return f"nbgrader metadata whose {key!r} is a {type(value).__name__}"
    gid = meta.get("grade_id")
    flagged = meta["grade"] or meta["solution"] or meta["locked"] or meta.get("task", False)
    if not flagged:
        return ""
    if not gid or not _GRADE_ID.match(gid):
        return f"nbgrader metadata with the grade id {str(gid)[:60]!r}"
    if meta["grade"] and not (isinstance(meta.get("points"), (int, float)) and 0 <= meta["points"] < float("inf")):
        return f"the graded cell {gid!r} without points"
    if gid not in known:
        return f"the unknown grade id {gid!r}"
    if known[gid] != cell_type:
        return f"the grade id {gid!r} on a {cell_type} cell (it is a {known[gid]} cell)"
    if gid in seen:
        return f"a second copy of the cell {gid!r}"
    seen.add(gid)
    return ""


def strip_bad(nb: Any, known: dict[str, str]) -> list[str]:
    """Remove the nbgrader metadata of every cell that has a problem; returns one line per cell so changed."""
    seen: set[str] = set()
    problems = []
    for index, cell in enumerate(nb.cells, start=1):
        meta = cell.get("metadata", {})
        if "nbgrader" not in meta:
            continue
        why = problem(meta["nbgrader"], cell.get("cell_type", ""), known, seen)
        if why:
            del meta["nbgrader"]
            problems.append(f"cell {index}: {why}; it was graded as an ordinary cell")
    return problems
