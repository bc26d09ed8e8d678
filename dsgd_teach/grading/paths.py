"""Where the assignment sources live by default: course/assignments/source in the checkout or the cwd."""

from __future__ import annotations

from pathlib import Path


def default_source_dir() -> Path | None:
    """course/assignments/source under the current directory, else next to the installed package, else None."""
    here = Path.cwd() / "course" / "assignments" / "source"
    if here.is_dir():
        return here
    checkout = Path(__file__).resolve().parents[2] / "course" / "assignments" / "source"
    return checkout if checkout.is_dir() else None
