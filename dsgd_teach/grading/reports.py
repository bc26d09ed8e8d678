"""Parse what a sandboxed worker sends back against a strict, size-bounded schema: everything in it is hostile input.

A result that is not JSON, too large, too deep or of the wrong shape is rejected whole; a test whose entry or any
of whose check reports breaks the schema is replaced by a "malformed" test (it scores 0) and the reason becomes an
integrity flag ("problems": what the grader itself observed). What passes has only known keys, plain types, finite nesting, bounded sizes and valid text, so
nothing downstream (comparing, rendering, writing) can fail on it.
"""

from __future__ import annotations

import json
import math
from typing import Any

from . import jsonbound
from .text import clean
from .values import NONFINITE

MAX_RESULT_BYTES = 32 * 1024 * 1024
MAX_DEPTH = 12  # values.encode nests at most 9 levels
MAX_SCALARS = 2_000_000  # numbers and strings in all the values of one result
MAX_LABEL = 2_000
MAX_STR_VALUE = 10_000
MAX_TEXT = 2_000  # errors, reasons, flags: cut here, shortened again before any file is written
MAX_TESTS, MAX_RECORDS, MAX_LIST = 1_000, 10_000, 1_000
# Checked on the bytes before json.loads builds anything: the grader's memory for one result stays bounded
# (about 32 MB of text, 200,000 dicts and lists, 2,000,000 numbers), whatever the worker sends.
BOUNDS = jsonbound.Bounds(MAX_RESULT_BYTES, max_containers=200_000, max_elements=2_000_000, max_depth=512)
MALFORMED = "malformed"
STUDENT_RECORD = {"label", "value", "error"}
REFERENCE_RECORD = {"label", "value", "rtol", "atol", "hidden", "hint", "solution_ok"}
RESULT_KEYS = {"tests", "skipped", "flags", "cell_errors", "stopped"}


class BadReport(ValueError):
    """A part of a worker's result that breaks the schema."""


def parse(data: bytes | None, mode: str = "student") -> dict[str, Any]:
    """The worker's result checked against the schema; raises BadReport when it must be refused whole."""
    if not data:
        raise BadReport("no result")
    try:
        jsonbound.check(data, BOUNDS, "the result")
    except jsonbound.TooLarge as exc:
        raise BadReport(str(exc)) from None
    try:
        raw = json.loads(data)
    except (ValueError, RecursionError, UnicodeDecodeError) as exc:
        raise BadReport(f"the result is not readable JSON ({type(exc).__name__})") from None
    _expect(isinstance(raw, dict), "the result is not an object")
    _only(raw, RESULT_KEYS, "the result")
    _expect(isinstance(raw.get("tests"), dict) and len(raw["tests"]) <= MAX_TESTS, "'tests' is not a small object")
    budget = [MAX_SCALARS]
    tests, problems = {}, []
    for gid, entry in raw["tests"].items():
        try:
            tests[clean(gid, MAX_LABEL)] = _test(entry, mode, budget)
        except BadReport as exc:
            tests[clean(gid, MAX_LABEL)] = {"status": MALFORMED, "records": [], "error": f"its report was refused: {exc}"}
            problems.append(f"a malformed check report for {clean(gid, 80)} ({exc})")
    return {"tests": tests, "skipped": _list(raw.get("skipped", []), _skip, "skipped"),
            "cell_errors": _list(raw.get("cell_errors", []), _cell_error, "cell_errors"),
            "flags": _list(raw.get("flags", []), _text, "flags"), "problems": problems,
            "stopped": _text(raw.get("stopped", ""))}


def _expect(ok: bool, why: str) -> None:
    if not ok:
        raise BadReport(why)


def _only(obj: dict[str, Any], keys: set[str], what: str) -> None:
    extra = set(obj) - keys
    _expect(not extra, f"{what} has unknown keys {sorted(clean(k, 40) for k in extra)[:3]}")


def _text(value: Any, limit: int = MAX_TEXT) -> str:
    _expect(isinstance(value, str), f"a {type(value).__name__} where text is expected")
    return clean(value, limit, escape=False)


def _index(value: Any) -> int:
    _expect(type(value) is int and -1 <= value < 10**6, "a cell index that is not a small integer")
    return value


def _list(value: Any, item: Any, what: str) -> list[Any]:
    _expect(isinstance(value, list) and len(value) <= MAX_LIST, f"'{what}' is not a short list")
    return [item(v) for v in value]


def _skip(entry: Any) -> dict[str, Any]:
    _expect(isinstance(entry, dict), "a skipped cell that is not an object")
    _only(entry, {"index", "why", "detail"}, "a skipped cell")
    return {"index": _index(entry.get("index")), "why": _text(entry.get("why"), 80), "detail": _text(entry.get("detail"))}


def _cell_error(entry: Any) -> dict[str, Any]:
    _expect(isinstance(entry, dict), "a cell error that is not an object")
    _only(entry, {"index", "error"}, "a cell error")
    return {"index": _index(entry.get("index")), "error": _text(entry.get("error"))}


def _test(entry: Any, mode: str, budget: list[int]) -> dict[str, Any]:
    _expect(isinstance(entry, dict), "the test's entry is not an object")
    _only(entry, {"status", "records", "error"}, "the test's entry")
    records = entry.get("records", [])
    _expect(isinstance(records, list) and len(records) <= MAX_RECORDS, "'records' is not a short list")
    return {"status": _text(entry.get("status"), 80), "error": _text(entry.get("error", "")),
            "records": [_record(r, mode, budget) for r in records]}


def _record(rec: Any, mode: str, budget: list[int]) -> dict[str, Any]:
    _expect(isinstance(rec, dict), "a check report that is not an object")
    _only(rec, REFERENCE_RECORD if mode == "reference" else STUDENT_RECORD, "a check report")
    label = rec.get("label")
    _expect(isinstance(label, str) and len(label) <= MAX_LABEL, "a check report without a short text label")
    out: dict[str, Any] = {"label": clean(label, MAX_LABEL, escape=False)}
    _expect(("value" in rec) != ("error" in rec) or mode == "reference", "a report needs a value or an error")
    if "error" in rec:
        out["error"] = _text(rec["error"])
    if "value" in rec or mode == "reference":
        out["value"] = value(rec.get("value"), budget)
    if mode == "reference":
        for key in ("rtol", "atol"):
            out[key] = _number(rec.get(key, 0.0))
        out["hidden"], out["solution_ok"] = bool(rec.get("hidden")), bool(rec.get("solution_ok"))
        out["hint"] = _text(rec.get("hint", ""))
    return out


def _value_number(v: Any) -> float | str:
    """A number inside a compared value: a float, or the name of NaN or an infinity (values.NONFINITE)."""
    return v if type(v) is str and v in NONFINITE else _number(v)


def _number(v: Any) -> float:
    _expect(type(v) in (int, float), f"a {type(v).__name__} where a number is expected")
    try:
        return float(v)
    except OverflowError:
        raise BadReport("an integer too large for a float") from None


def _count(budget: list[int], n: int) -> None:
    budget[0] -= n
    _expect(budget[0] >= 0, "the reported values are too large")


def value(enc: Any, budget: list[int], depth: int = 0) -> dict[str, Any]:
    """An encoded value (values.encode's format) rebuilt from known keys and plain types only."""
    _expect(depth <= MAX_DEPTH, "a value nested too deeply")
    _expect(isinstance(enc, dict) and isinstance(enc.get("t"), str), "a value that is not a tagged object")
    kind = enc["t"]
    _only(enc, {"t", "v", "shape"} if kind == "arr" else {"t", "v"}, f"a value of kind {clean(kind, 20)!r}")
    v = enc.get("v")
    _count(budget, 1)
    if kind == "atom":
        _expect(v is None or isinstance(v, bool), "an atom that is not None or a bool")
        return {"t": "atom", "v": v}
    if kind == "str":
        _expect(isinstance(v, str) and len(v) <= MAX_STR_VALUE, "a string value that is not short text")
        return {"t": "str", "v": clean(v, MAX_STR_VALUE, escape=False)}
    if kind == "num":
        return {"t": "num", "v": _value_number(v)}
    if kind == "arr":
        shape = enc.get("shape")
        _expect(isinstance(shape, list) and len(shape) <= 32 and all(type(n) is int and n >= 0 for n in shape),
                "an array whose shape is not a list of sizes")
        _expect(isinstance(v, list) and len(v) == math.prod(shape), "an array whose values do not fill its shape")
        _count(budget, len(v))
        return {"t": "arr", "shape": list(shape), "v": [_value_number(x) for x in v]}
    _expect(isinstance(v, list) and len(v) <= MAX_RECORDS, f"a {clean(kind, 20)!r} value that is not a short list")
    if kind == "seq":
        return {"t": "seq", "v": [value(x, budget, depth + 1) for x in v]}
    if kind == "dict":
        _expect(all(isinstance(p, list) and len(p) == 2 and isinstance(p[0], str) for p in v), "a malformed dict")
        return {"t": "dict", "v": [[clean(k, MAX_LABEL, escape=False), value(x, budget, depth + 1)] for k, x in v]}
    raise BadReport(f"a value of unknown kind {clean(kind, 20)!r}")
