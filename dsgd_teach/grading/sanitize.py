"""Reduce a parsed notebook to what grading needs, in plain types: run by the reading child (nbread.py).

Every cell becomes {cell_type, source, metadata: {nbgrader}} (code cells also get empty outputs, markdown cells keep
well-formed attachments): a cell of an unknown type or shape is dropped, a source that is not text becomes text,
nbgrader metadata that is not a small flat object is replaced by a marker the nbgrader route refuses. Of the
notebook's metadata only the kernel's name and language and the grader's own notes (`GRADING_KEY`) are kept.
"""

from __future__ import annotations

from typing import Any

GRADING_KEY = "dsgd_teach_grading"
CELL_TYPES = ("code", "markdown", "raw")
MAX_META_KEYS = 20
MAX_META_TEXT = 200
MAX_NOTES = 50


def sanitize(nb: Any) -> dict[str, Any]:
    """A valid nbformat 4.4 notebook dict with only the sources, nbgrader metadata and attachments of nb."""
    cells, dropped = [], 0
    raw_cells = nb.get("cells") if isinstance(nb, dict) else None
    for cell in raw_cells if isinstance(raw_cells, list) else []:
        kept = _cell(cell)
        if kept is None:
            dropped += 1
        else:
            cells.append(kept)
    meta = nb.get("metadata") if isinstance(nb, dict) else None
    meta = meta if isinstance(meta, dict) else {}
    out_meta: dict[str, Any] = {k: _flat_text(meta[k]) for k in ("kernelspec", "language_info")
                                if isinstance(meta.get(k), dict)}
    notes = _notes(meta.get(GRADING_KEY))
    if dropped:
        notes["problems"] = (notes.get("problems", []) + [f"{dropped} cell(s) of an unknown type or shape were "
                                                          "dropped"])[:MAX_NOTES]
    if notes:
        out_meta[GRADING_KEY] = notes
    return {"nbformat": 4, "nbformat_minor": 4, "metadata": out_meta, "cells": cells}


def _cell(cell: Any) -> dict[str, Any] | None:
    if not isinstance(cell, dict) or cell.get("cell_type") not in CELL_TYPES:
        return None
    source = cell.get("source", "")
    if isinstance(source, list):
        source = "".join(s for s in source if isinstance(s, str))
    elif not isinstance(source, str):
        source = ""
    meta = cell.get("metadata")
    nbgrader = meta.get("nbgrader") if isinstance(meta, dict) else None
    out: dict[str, Any] = {"cell_type": cell["cell_type"], "source": source,
                           "metadata": {} if nbgrader is None else {"nbgrader": _nbgrader(nbgrader)}}
    if cell["cell_type"] == "code":
        out.update(outputs=[], execution_count=None)
    attachments = cell.get("attachments")
    if cell["cell_type"] == "markdown" and _attachments_ok(attachments):
        out["attachments"] = attachments
    return out


def _nbgrader(meta: Any) -> dict[str, Any]:
    """The nbgrader metadata if it is a small object of scalars; else a marker that fails nbgrader's schema."""
    if not isinstance(meta, dict):
        return {"dsgd_invalid": f"the nbgrader metadata is a {type(meta).__name__}, not an object"}
    if len(meta) > MAX_META_KEYS:
        return {"dsgd_invalid": f"the nbgrader metadata has {len(meta)} keys"}
    out = {}
    for key, value in meta.items():
        if not isinstance(key, str) or len(key) > MAX_META_TEXT:
            return {"dsgd_invalid": "the nbgrader metadata has a key that is not short text"}
        if isinstance(value, str) and len(value) > MAX_META_TEXT:
            return {"dsgd_invalid": f"the nbgrader metadata's {key!r} is longer than {MAX_META_TEXT} characters"}
        if value is not None and not isinstance(value, (str, int, float, bool)):
            return {"dsgd_invalid": f"the nbgrader metadata's {key!r} is a {type(value).__name__}"}
        out[key] = value
    return out


def _flat_text(meta: dict[str, Any]) -> dict[str, str]:
    return {str(k)[:MAX_META_TEXT]: v[:MAX_META_TEXT] for k, v in list(meta.items())[:MAX_META_KEYS]
            if isinstance(v, str)}


def _notes(value: Any) -> dict[str, Any]:
    """The grader's own notes from an earlier stage (short texts only)."""
    if not isinstance(value, dict):
        return {}
    out: dict[str, Any] = {}
    if isinstance(value.get("unreadable"), str):
        out["unreadable"] = value["unreadable"][:400]
    problems = value.get("problems")
    if isinstance(problems, list):
        out["problems"] = [p[:400] for p in problems if isinstance(p, str)][:MAX_NOTES]
    return out


def _attachments_ok(value: Any) -> bool:
    return isinstance(value, dict) and len(value) <= 100 and all(
        isinstance(k, str) and isinstance(v, dict) and all(isinstance(m, str) and isinstance(d, str)
                                                           for m, d in v.items()) for k, v in value.items())
