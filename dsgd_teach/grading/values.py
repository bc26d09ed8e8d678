"""Encode test values as plain JSON and compare them, identically in the student's kernel and in the grader."""

from __future__ import annotations

import math
from numbers import Number
from typing import Any

import numpy as np

MAX_ELEMENTS = 200_000

#: JSON has no NaN or infinity (and Jupyter's messages turn them into other text), so they travel by these names.
NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def _num(x: float) -> float | str:
    """x, or its NONFINITE name when it is not finite."""
    return x if math.isfinite(x) else "nan" if math.isnan(x) else "inf" if x > 0 else "-inf"


def as_float(v: Any) -> float | None:
    """An encoded number (a float, an int, or a NONFINITE name) as a float; None for anything else."""
    if isinstance(v, str):
        return NONFINITE.get(v)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


def encode(value: Any, depth: int = 0) -> dict[str, Any]:
    """A JSON-able, type-tagged copy of value: arrays (and lists of numbers) keep shape, containers recurse."""
    if depth > 8:
        raise ValueError("value is nested too deeply to compare")
    if value is None or isinstance(value, (bool, np.bool_)):
        return {"t": "atom", "v": None if value is None else bool(value)}
    if isinstance(value, str):
        return {"t": "str", "v": value[:10_000]}
    if isinstance(value, (Number, np.number)) and not isinstance(value, complex):
        return {"t": "num", "v": _num(float(value))}
    if isinstance(value, dict):
        items = sorted(((str(k), v) for k, v in value.items()), key=lambda kv: kv[0])
        return {"t": "dict", "v": [[k, encode(v, depth + 1)] for k, v in items]}
    if isinstance(value, (list, tuple, np.ndarray)):
        arr = _numeric_array(value)
        if arr is not None:
            if arr.size > MAX_ELEMENTS:
                raise ValueError(f"array with {arr.size} elements is too large to compare")
            flat = arr.astype(np.float64).ravel()
            v = flat.tolist() if np.isfinite(flat).all() else [_num(x) for x in flat.tolist()]
            return {"t": "arr", "shape": list(arr.shape), "v": v}
        return {"t": "seq", "v": [encode(v, depth + 1) for v in list(value)[:10_000]]}
    if isinstance(value, (set, frozenset)):
        return {"t": "seq", "v": [encode(v, depth + 1) for v in sorted(value, key=repr)]}
    raise TypeError(f"cannot compare a value of type {type(value).__name__}")


def _numeric_array(value: Any) -> np.ndarray | None:
    """value as a numeric ndarray when it is one (or a rectangular list of numbers), else None."""
    if isinstance(value, np.ndarray):
        return value if value.dtype.kind in "biuf" else None
    if len(value) == 0:
        return np.zeros(0)
    try:
        arr = np.asarray(value)
    except (ValueError, TypeError):
        return None
    return arr if arr.dtype.kind in "biuf" else None


def same(got: dict[str, Any], expected: dict[str, Any], rtol: float = 0.0, atol: float = 0.0) -> bool:
    """True when two encoded values match: exactly, or within rtol/atol for numbers (NaN never matches)."""
    if got.get("t") != expected.get("t"):
        return False
    kind = expected["t"]
    if kind == "num":
        return _close(got["v"], expected["v"], rtol, atol)
    if kind == "arr":
        if list(got["shape"]) != list(expected["shape"]) or len(got["v"]) != len(expected["v"]):
            return False
        return all(_close(a, b, rtol, atol) for a, b in zip(got["v"], expected["v"], strict=True))
    if kind in ("seq", "dict"):
        g, e = got["v"], expected["v"]
        if len(g) != len(e):
            return False
        if kind == "dict":
            return all(gk == ek and same(gv, ev, rtol, atol) for (gk, gv), (ek, ev) in zip(g, e, strict=True))
        return all(same(a, b, rtol, atol) for a, b in zip(g, e, strict=True))
    return got["v"] == expected["v"]


def _close(a: Any, b: Any, rtol: float, atol: float) -> bool:
    a, b = as_float(a), as_float(b)
    if a is None or b is None:
        return False
    if math.isnan(a) or math.isnan(b):
        return False
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= atol + rtol * abs(b)


def show(encoded: dict[str, Any], limit: int = 300) -> str:
    """A short human-readable rendering of an encoded value for feedback messages."""
    kind = encoded.get("t")
    if kind == "arr":
        text = f"array(shape={tuple(encoded['shape'])}, values={_fmt_list(encoded['v'])})"
    elif kind == "num":
        v = encoded["v"]
        text = repr(int(v)) if float(v).is_integer() and abs(v) < 1e15 else repr(v)
    elif kind == "seq":
        text = "[" + ", ".join(show(v, limit) for v in encoded["v"]) + "]"
    elif kind == "dict":
        text = "{" + ", ".join(f"{k!r}: {show(v, limit)}" for k, v in encoded["v"]) + "}"
    else:
        text = repr(encoded.get("v"))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe(encoded: dict[str, Any]) -> str:
    """A value in words (kind, shape, integer- or float-valued), never its values: for hidden checks' feedback."""
    kind = encoded.get("t")
    if kind == "arr":
        values = encoded.get("v", [])
        dtype = "integer-valued" if all(float(v).is_integer() for v in values) else "float"
        nan = ", with NaN" if any(isinstance(v, float) and math.isnan(v) for v in values) else ""
        return f"{'an' if dtype[0] in 'aeiou' else 'a'} {dtype} array of shape {tuple(encoded.get('shape', ()))}{nan}"
    if kind == "num":
        v = encoded.get("v")
        if isinstance(v, float) and math.isnan(v):
            return "NaN"
        return "a whole number" if isinstance(v, (int, float)) and float(v).is_integer() else "a number"
    if kind == "seq":
        return f"a list of {len(encoded.get('v', []))} items"
    if kind == "dict":
        return f"a dict with {len(encoded.get('v', []))} keys"
    if kind == "str":
        return f"a string of {len(encoded.get('v', ''))} characters"
    value = encoded.get("v")
    return "None" if value is None else "a bool"


def _fmt_list(values: list[float]) -> str:
    shown = [repr(int(v)) if float(v).is_integer() else f"{v:.6g}" for v in values[:12]]
    return "[" + ", ".join(shown) + (", ..." if len(values) > 12 else "") + "]"
