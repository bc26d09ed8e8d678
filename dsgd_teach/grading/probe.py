"""Kernel-side reporters the grader substitutes for `check`: they publish raw values, never a verdict.

The student's kernel only ever reports what the student's code returned; whether that is right is decided by the
grader, which compares it with the value the reference kernel reported for the same check.
"""

from __future__ import annotations

from typing import Any

from .mime import MIME
from .values import encode, same


def _publish(payload: dict[str, Any]) -> None:
    from IPython.display import publish_display_data

    publish_display_data({MIME: payload})


def record(label: Any, got: Any) -> None:
    """Student kernel: report the value a check received (or why it could not be encoded)."""
    try:
        payload = {"label": str(label), "value": encode(got)}
    except Exception as exc:  # noqa: BLE001 - any failure to encode is the student's, and is reported
        payload = {"label": str(label), "error": f"{type(exc).__name__}: {exc}"}
    _publish(payload)


def reference(label: Any, got: Any, expect: Any, *, rtol: float = 0.0, atol: float = 0.0, hidden: bool = False,
              hint: str = "") -> None:
    """Reference kernel: report the expected value with its tolerance, and whether the solution matched it."""
    exp = encode(expect)
    try:
        ok = same(encode(got), exp, rtol, atol)
    except Exception:  # noqa: BLE001 - reported as a broken solution
        ok = False
    _publish({"label": str(label), "value": exp, "rtol": rtol, "atol": atol, "hidden": hidden, "hint": hint,
              "solution_ok": ok})
