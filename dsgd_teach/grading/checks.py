"""Checks used by assignment test cells: compare a value with the expected one and say what went wrong, with a hint.

Students call these through the visible test cells while they work; the grader never trusts them (it re-runs the
test cells with `check` rewritten to report the raw value, and compares outside the student's kernel).
"""

from __future__ import annotations

import os
from typing import Any

from .values import encode, same, show

DEFAULT_SEED = 20240601


def grader_seed() -> int:
    """The seed hidden tests draw their inputs from: fixed for self-study, chosen per batch by the grader."""
    return int(os.environ.get("DSGD_GRADER_SEED", DEFAULT_SEED))


def check(label: str, got: Any, expect: Any, *, rtol: float = 0.0, atol: float = 0.0, hint: str = "") -> None:
    """Raise AssertionError (expected, got, hint) unless got equals expect (within rtol/atol for numbers)."""
    try:
        got_enc = encode(got)
    except (TypeError, ValueError) as exc:
        raise AssertionError(f"{label}: your value could not be checked ({exc}).\n  hint: {hint}") from None
    exp_enc = encode(expect)
    if same(got_enc, exp_enc, rtol, atol):
        return
    tol = f" (within rtol={rtol}, atol={atol})" if rtol or atol else ""
    message = f"{label}{tol}\n  expected: {show(exp_enc)}\n  got:      {show(got_enc)}"
    if got_enc["t"] != exp_enc["t"]:
        message += f"\n  (expected a {_kind(exp_enc)}, got a {_kind(got_enc)})"
    elif exp_enc["t"] == "arr" and got_enc["shape"] != exp_enc["shape"]:
        message += f"\n  (shape {tuple(got_enc['shape'])} differs from {tuple(exp_enc['shape'])})"
    if hint:
        message += f"\n  hint: {hint}"
    raise AssertionError(message)


def _kind(encoded: dict[str, Any]) -> str:
    return {"arr": "numeric array/list", "num": "number", "seq": "list", "dict": "dict", "str": "string"}.get(
        encoded["t"], "bool/None"
    )
