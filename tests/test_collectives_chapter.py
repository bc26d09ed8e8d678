"""Chapter 05's prose: the corrected statements stay corrected, and the ring's source is shown where it runs."""

from __future__ import annotations

import nbformat
import pytest

from dsgd_teach.collectives import HAND_WRITTEN, elements_sent
from dsgd_teach.course_runner import COURSE_DIR

CHAPTER = COURSE_DIR / "05_allreduce.ipynb"


@pytest.fixture(scope="module")
def cells() -> list:
    return nbformat.read(CHAPTER, as_version=4).cells


def prose(cells: list) -> str:
    return "\n".join(c.source for c in cells if c.cell_type == "markdown")


def test_wrong_statements_do_not_come_back(cells: list) -> None:
    text = prose(cells)
    assert "2K/N$ per neighbour" not in text  # each ring link carries 2(N-1)K/N, about 2K
    assert "tree** (recursive doubling)" not in text  # recursive doubling is a butterfly
    assert "$2(N-1)K\\beta$" not in text  # the star's bound is per direction on full-duplex links
    assert "full-duplex" in text
    assert "$N/2$" in text and "not $N/2$" in text  # the load ratio, and why the time ratio is about N instead
    assert "2(N-1)K/N \\approx 2K" in text
    assert "double binary tree" in text and "Sanders" in text and "Thakur" in text


def test_every_hand_written_algorithm_is_in_the_cost_table(cells: list) -> None:
    text = prose(cells)
    for row in ("naive (star)", "recursive doubling", "binomial tree", "halving-doubling", "ring"):
        assert f"| {row} |" in text
    code = "\n".join(c.source for c in cells if c.cell_type == "code")
    assert '"tree"' not in code  # the chapter names recursive doubling "doubling"
    assert all(name in code or name in text for name in HAND_WRITTEN)


def test_the_ring_source_is_shown_before_the_links_are_measured(cells: list) -> None:
    sources = [c.source for c in cells if c.cell_type == "code"]
    shown = next(i for i, s in enumerate(sources) if "show_source(ring_allreduce)" in s)
    measured = next(i for i, s in enumerate(sources) if "link_runs = {" in s)
    assert shown < measured


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_the_stated_link_loads_match_the_closed_forms(n: int) -> None:
    k = 24 * n  # divisible by n
    ring = elements_sent("ring", k, n, 0)  # all of it goes to one neighbour: that link's load
    star = elements_sent("naive", k, n, 0)
    assert ring == 2 * (n - 1) * k // n < 2 * k
    assert star == (n - 1) * k and star / ring == n / 2
