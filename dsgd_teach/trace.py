"""The tidy event trace every experiment returns, and the result object that carries it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np
import pandas as pd

#: Columns every trace has, in this order; experiments may add their own after them.
TRACE_COLUMNS: tuple[str, ...] = (
    "time",  # seconds since the run started (wall clock)
    "worker",  # rank of the worker that produced the event (-1: the driver or the server)
    "step",  # the worker's own step counter (or the global step for synchronous loops)
    "event",  # what happened: "update", "push", "fetch", "discarded", "eval", ...
    "loss",  # training loss measured at this event (NaN when not measured)
    "version_read",  # parameter version the gradient was computed from
    "version_applied",  # parameter version after the update was applied
    "staleness",  # version_applied - 1 - version_read for asynchronous updates, 0 for synchronous ones
    "bytes_sent",  # bytes this event moved over the network (or through shared memory)
    "injected_delay",  # seconds of straggler delay injected on purpose (0 when none)
)

_DEFAULTS: dict[str, Any] = {
    "worker": -1,
    "step": -1,
    "event": "update",
    "loss": np.nan,
    "version_read": -1,
    "version_applied": -1,
    "staleness": 0,
    "bytes_sent": 0,
    "injected_delay": 0.0,
}


class StopRequested(Exception):
    """Raised by an on_update callback to stop a run early; run() then returns a partial result."""


OnUpdate = Callable[[dict[str, Any]], None]


class TraceRecorder:
    """Collects events as they arrive, forwards each to on_update, and builds the tidy DataFrame."""

    def __init__(self, on_update: OnUpdate | None = None, t0: float | None = None) -> None:
        self.t0 = time.time() if t0 is None else t0
        self.on_update = on_update
        self._rows: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def record(self, **event: Any) -> dict[str, Any]:
        """Add one event (missing columns get defaults, `time` defaults to now) and notify on_update."""
        row = {**_DEFAULTS, **event}
        row.setdefault("time", time.time() - self.t0)
        with self._lock:
            self._rows.append(row)
        if self.on_update is not None:
            self.on_update(row)
        return row

    def extend(self, events: list[dict[str, Any]]) -> None:
        """Record several events (e.g. a batch that came back from a worker)."""
        if self.on_update is None and type(self).record is TraceRecorder.record:  # nobody watches, nothing to add:
            # one pass under one lock (a run may send 100,000 events)
            now = time.time() - self.t0
            rows = [{**_DEFAULTS, "time": now, **event} for event in events]
            with self._lock:
                self._rows.extend(rows)
            return
        stop = None
        for event in events:
            try:
                self.record(**event)
            except StopRequested as exc:
                stop = exc
        if stop is not None:
            raise stop

    def __len__(self) -> int:
        return len(self._rows)

    def frame(self) -> pd.DataFrame:
        """The trace so far as a DataFrame sorted by time, standard columns first."""
        with self._lock:
            rows = list(self._rows)
        return to_frame(rows)


def to_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """Turn event dicts into the tidy trace DataFrame."""
    df = pd.DataFrame(rows)
    for col in TRACE_COLUMNS:
        if col not in df.columns:
            df[col] = _DEFAULTS.get(col, np.nan) if col != "time" else 0.0
    extra = [c for c in df.columns if c not in TRACE_COLUMNS]
    df = df[list(TRACE_COLUMNS) + extra]
    if len(df):
        df = df.sort_values("time", kind="stable").reset_index(drop=True)
    return df


Extras = TypeVar("Extras")


@dataclass
class Result(Generic[Extras]):
    """What run() returns: the config, the event trace, summary metrics and (optionally) final parameters."""

    config: Any
    trace: pd.DataFrame
    summary: dict[str, float] = field(default_factory=dict)
    params: np.ndarray | None = None
    stopped: bool = False
    extras: Extras | None = None  # what one experiment returns beside these (a typed dataclass of its own)

    def __repr__(self) -> str:
        metrics = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in self.summary.items())
        flag = " (stopped early)" if self.stopped else ""
        return f"Result({type(self.config).__name__}, {len(self.trace)} events{flag}: {metrics})"


STAT_HOW = ("median", "mean", "max", "min", "first", "last")


def stat(rows: pd.DataFrame | pd.Series | np.ndarray | list[float], column: str | None = None,
         how: str = "median") -> float:
    """A summary figure of a trace column (rows[column], or the values rows): its median, mean, max, min, first or
    last value as a float; nan when there are no rows or no such column (a run stopped before logging it)."""
    if how not in STAT_HOW:
        raise ValueError(f"how must be one of {', '.join(STAT_HOW)}; got {how!r}")
    if column is not None:
        if column not in getattr(rows, "columns", ()):
            return float("nan")
        rows = rows[column]
    values = rows if isinstance(rows, pd.Series) else pd.Series(np.asarray(rows, dtype=float).reshape(-1))
    if not len(values):
        return float("nan")
    if how in ("first", "last"):
        return float(values.iloc[0 if how == "first" else -1])
    return float(getattr(values, how)())


def ratio(numerator: float, denominator: float) -> float:
    """numerator / denominator as a float; nan when the denominator is not positive (nothing measured yet)."""
    return float(numerator) / float(denominator) if denominator > 0 else float("nan")
