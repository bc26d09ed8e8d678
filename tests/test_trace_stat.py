"""stat() and ratio(): the one way an experiment's summary reads a figure from a trace column or divides two
measurements, nan when the run logged none (never a ZeroDivisionError, an IndexError or a numpy warning)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from dsgd_teach.trace import ratio, stat


def test_stat_reads_each_figure_and_nan_when_empty():
    s = pd.Series([3.0, 1.0, 2.0, 10.0])
    assert stat(s) == 2.5 and stat(s, how="max") == 10.0 and stat(s, how="min") == 1.0 and stat(s, how="mean") == 4.0
    assert stat(s, how="first") == 3.0 and stat(s, how="last") == 10.0
    rows = pd.DataFrame({"event": ["eval", "eval"], "train_loss": [0.5, 0.25]})
    assert stat(rows, "train_loss", "last") == 0.25
    for how in ("median", "mean", "max", "min", "first", "last"):
        assert math.isnan(stat(pd.Series([], dtype=float), how=how))
        assert math.isnan(stat(rows[rows.event == "update"], "train_loss", how))
        assert math.isnan(stat([], how=how)) and math.isnan(stat(np.array([]), how=how))


def test_stat_reads_lists_and_arrays_as_a_series_would():
    values = [3.0, 1.0, 2.0, 10.0]
    for how in ("median", "mean", "max", "min", "first", "last"):
        assert stat(values, how=how) == stat(np.array(values), how=how) == stat(pd.Series(values), how=how)
    assert stat(np.array([[1.0, 2.0], [3.0, 4.0]]), how="last") == 4.0  # flattened


def test_ratio_is_nan_until_the_denominator_was_measured():
    assert ratio(3, 2) == 1.5 and isinstance(ratio(3, 2), float)
    assert math.isnan(ratio(3, 0)) and math.isnan(ratio(0, 0)) and math.isnan(ratio(1, -1.0))


def test_stat_is_nan_for_a_column_a_stopped_run_never_logged():
    """A run stopped before its first evaluation has no train_loss column at all: nan, not an AttributeError."""
    updates_only = pd.DataFrame({"event": ["update"], "worker": [0], "step": [1]})
    evals = updates_only[updates_only.event == "eval"]
    assert math.isnan(stat(evals, "train_loss", "last"))


def test_stat_names_a_bad_figure():
    with pytest.raises(ValueError, match="how must be one of median, mean, max, min, first, last; got 'mode'"):
        stat(pd.Series([1.0]), how="mode")
