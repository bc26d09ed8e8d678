"""Chapter 07's schedule loops perform exactly the actions of their schedule tables (which the plots and simulator use)."""

from __future__ import annotations

import pytest

from dsgd_teach.pipeline import SCHEDULES, gpipe, naive, one_f_one_b
from dsgd_teach.pipeline.actions import TrainStep, actions_of

LOOPS: dict[str, TrainStep] = {"naive": naive.train_step, "gpipe": gpipe.train_step, "1f1b": one_f_one_b.train_step}


@pytest.mark.parametrize("name", list(LOOPS))
def test_each_loop_performs_its_tables_actions_in_order(name: str) -> None:
    for p, m in [(1, 1), (2, 1), (2, 4), (2, 8), (3, 2), (3, 5), (4, 4), (4, 8), (5, 3), (8, 16)]:
        for s in range(p):
            assert actions_of(LOOPS[name], p, m, s) == SCHEDULES[name](p, m, s), (name, p, m, s)


def test_1f1b_loop_warms_up_then_alternates_then_cools_down() -> None:
    assert actions_of(one_f_one_b.train_step, 4, 6, 1) == [
        ("F", 0), ("F", 1), ("F", 2), ("B", 0), ("F", 3), ("B", 1), ("F", 4), ("B", 2), ("F", 5), ("B", 3),
        ("B", 4), ("B", 5)]
