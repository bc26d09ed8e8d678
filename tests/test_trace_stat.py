"""stat(): the one way an experiment's summary reads a figure from a trace column, nan when the run logged none."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from dsgd_teach.trace import stat


def test_stat_reads_each_figure_and_nan_when_empty():
    s = pd.Series([3.0, 1.0, 2.0, 10.0])
    assert stat(s) == 2.5 and stat(s, "max") == 10.0 and stat(s, "min") == 1.0
    assert stat(s, "first") == 3.0 and stat(s, "last") == 10.0
    for how in ("median", "max", "min", "first", "last"):
        assert math.isnan(stat(pd.Series([], dtype=float), how))
    with pytest.raises(ValueError, match="how must be one of median, max, min, first, last; got 'mean'"):
        stat(s, "mean")
