"""Validation helpers for the frozen experiment configs: a bad value names its field and the allowed range."""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import Any


def smoke_mode() -> bool:
    """True when DSGD_SMOKE is set: every chapter then runs on small data for few steps (CI, quick checks)."""
    return os.environ.get("DSGD_SMOKE", "").strip().lower() not in ("", "0", "false", "no")


def sized(full: Any, smoke: Any) -> Any:
    """`smoke` in smoke mode, else `full`: how notebooks and benchmarks pick their problem sizes."""
    return smoke if smoke_mode() else full


def check_int(name: str, value: Any, lo: int, hi: int | None = None) -> None:
    """Raise ValueError unless value is an int in [lo, hi]."""
    span = f"in [{lo}, {hi}]" if hi is not None else f">= {lo}"
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer {span}, got {value!r}")
    if value < lo or (hi is not None and value > hi):
        raise ValueError(f"{name} must be an integer {span}, got {value}")


def check_float(
    name: str, value: Any, lo: float, hi: float, *, lo_open: bool = False, hi_open: bool = False
) -> None:
    """Raise ValueError unless value is a finite number inside the interval (open or closed ends)."""
    span = f"{'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a number in {span}, got {value!r}")
    below = value <= lo if lo_open else value < lo
    above = value >= hi if hi_open else value > hi
    if below or above:
        raise ValueError(f"{name} must be a number in {span}, got {value}")


#: The largest seed a config accepts (numpy and torch both take it).
MAX_SEED = 2**31 - 1


def check_seed(value: Any, name: str = "seed") -> None:
    """Raise ValueError unless value is a seed: an int in [0, MAX_SEED]."""
    check_int(name, value, 0, MAX_SEED)


def check_timeout(name: str, value: Any, hi: float = 3600.0) -> None:
    """Raise ValueError unless value is a number of seconds in (0, hi] (one hour by default)."""
    check_float(name, value, 0.0, hi, lo_open=True)


def check_choice(name: str, value: Any, choices: Iterable[Any]) -> None:
    """Raise ValueError unless value is one of choices."""
    choices = tuple(choices)
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}; got {value!r}")


def check_bool(name: str, value: Any) -> None:
    """Raise ValueError unless value is a bool."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")


@dataclass(frozen=True)
class Config:
    """Base of every experiment config: frozen, validated in validate(), printable as a dict."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check every field; subclasses raise ValueError naming the field and its allowed range."""

    def as_dict(self) -> dict[str, Any]:
        """The config's fields as a plain dict (for traces, CSVs and the CLI)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def replace(self, **changes: Any) -> Config:
        """A validated copy with some fields changed."""
        return type(self)(**{**self.as_dict(), **changes})
