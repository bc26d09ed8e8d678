"""Chapter 05's logarithmic allreduces on paper: who sends what to whom in the binomial tree and halving-doubling."""

from __future__ import annotations

import pytest

from dsgd_teach.collectives import (
    ALGORITHMS,
    HAND_WRITTEN,
    AllreduceConfig,
    SweepConfig,
    elements_sent,
    schedule,
)
from dsgd_teach.collectives.algorithms import check_algorithm, get_allreduce
from dsgd_teach.collectives.layout import chunk_sizes, folded_rank, tree_rounds, unfolded_rank


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7, 8, 9])
def test_folding_pairs_every_sitting_rank_with_a_participant(n: int) -> None:
    taking_part = [r for r in range(n) if folded_rank(r, n) is not None]
    assert len(taking_part) & (len(taking_part) - 1) == 0  # a power of two take part
    assert sorted(folded_rank(r, n) for r in taking_part) == list(range(len(taking_part)))
    assert all(unfolded_rank(folded_rank(r, n), n) == r for r in taking_part)


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6, 7, 8])
def test_binomial_tree_reduces_to_rank_0_and_broadcasts_back(n: int) -> None:
    k = 10
    sched = schedule("binomial", k, n)
    reduce = [m for m in sched if m["phase"] == "reduce"]
    bcast = [m for m in sched if m["phase"] == "broadcast"]
    assert len(reduce) == len(bcast) == n - 1  # a tree over n ranks has n - 1 edges, each used twice
    assert {(m["src"], m["dst"]) for m in reduce} == {(m["dst"], m["src"]) for m in bcast}
    assert len({m["step"] for m in sched}) == 2 * tree_rounds(n)
    # the reduce reaches rank 0 from everybody: follow the parent pointers
    parent = {m["src"]: m["dst"] for m in reduce}
    for r in range(1, n):
        seen = r
        while seen != 0:
            seen = parent[seen]
    assert elements_sent("binomial", k, n, 0) == tree_rounds(n) * k  # the root sends to one child per round


@pytest.mark.parametrize("k", [0, 1, 3, 8, 10, 1001])
@pytest.mark.parametrize("n", [2, 3, 4, 5, 8])
def test_halving_doubling_moves_the_ring_bytes_in_log_steps(k: int, n: int) -> None:
    sched = schedule("halving-doubling", k, n)
    if k == 0:
        assert sched == []
        return
    p = 1 << (n.bit_length() - 1)
    steps = {m["step"] for m in sched}
    folds = 2 if n > p else 0
    assert len(steps) <= 2 * (p.bit_length() - 1) + folds
    for m in sched:  # partners differ in one bit of their folded rank
        if m["phase"] in ("halving", "doubling"):
            diff = folded_rank(m["src"], n) ^ folded_rank(m["dst"], n)
            assert diff and diff & (diff - 1) == 0
    if n == p and k % n == 0:  # each rank sends 2 (N-1)/N K, like the ring
        assert all(elements_sent("halving-doubling", k, n, r) == 2 * (n - 1) * k // n for r in range(n))
    # every send of a step is matched by the partner's send back (an exchange), and the largest message of the
    # halving phase is about half the vector
    halving = [m for m in sched if m["phase"] == "halving"]
    assert max(m["elements"] for m in halving) <= sum(chunk_sizes(k, p)[: p // 2]) or not halving


def test_names_are_checked_and_tree_is_not_a_tree() -> None:
    assert set(HAND_WRITTEN) <= set(ALGORITHMS) and "tree" not in ALGORITHMS
    assert get_allreduce("tree") is get_allreduce("doubling")
    for name in ALGORITHMS:
        assert AllreduceConfig(algorithm=name).algorithm == name
    assert SweepConfig(algorithms="binomial, halving-doubling").algorithm_list == ("binomial", "halving-doubling")
    with pytest.raises(ValueError, match="algorithm must be one of .*'binomial'.*'halving-doubling'"):
        check_algorithm("algorithm", "butterfly")
    with pytest.raises(ValueError, match="unknown allreduce 'star'"):
        get_allreduce("star")
