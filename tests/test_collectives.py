"""Chapter 05 without a cluster: chunking, the ring schedule, byte counts in closed form, cost model, configs."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dsgd_teach.collectives import (
    AllreduceConfig,
    AllreduceSGDConfig,
    AlphaBeta,
    SweepConfig,
    bus_bandwidth,
    chunk_sizes,
    elements_sent,
    fit_alpha_beta,
    predict_seconds,
    ring_schedule,
    ring_states,
)
from dsgd_teach.collectives.cost_model import schedule_steps
from dsgd_teach.experiments import get


@pytest.mark.parametrize("k", [0, 1, 2, 3, 7, 10, 12, 1001])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_chunks_tile_the_vector(k: int, n: int) -> None:
    sizes = chunk_sizes(k, n)
    assert len(sizes) == n and sum(sizes) == k
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("k", [0, 2, 3, 10, 12, 1001])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_ring_schedule_sends_each_rank_its_share(k: int, n: int) -> None:
    sched = ring_schedule(k, n)
    for r in range(n):
        sent = sum(m["elements"] for m in sched if m["src"] == r)
        assert sent == elements_sent("ring", k, n, r)
        received = sum(m["elements"] for m in sched if m["dst"] == r)
        assert received == (elements_sent("ring", k, n, (r - 1) % n) if n > 1 else 0)
    if n > 1 and k % n == 0:  # the textbook figure: 2(N-1)/N * K per rank
        assert all(elements_sent("ring", k, n, r) == 2 * (n - 1) * k // n for r in range(n))
    steps = {m["step"] for m in sched}
    assert steps <= set(range(2 * (n - 1)))
    for m in sched:  # only neighbours talk
        assert m["dst"] == (m["src"] + 1) % n


@pytest.mark.parametrize("n", [2, 3, 4, 6])
def test_ring_states_reduce_then_gather(n: int) -> None:
    states = ring_states(n, ring_schedule(5 * n + 1, n))
    assert len(states) == 2 * (n - 1) + 1
    everyone = frozenset(range(n))
    after_rs = states[n - 1]
    for r in range(n):  # after reduce-scatter rank r owns the finished chunk r + 1
        assert after_rs[r][(r + 1) % n] == everyone
        assert sum(cell == everyone for cell in after_rs[r]) == 1
    assert all(cell == everyone for row in states[-1] for cell in row)


def test_ring_states_with_empty_chunks_still_complete() -> None:
    n, k = 4, 2  # K < N: two chunks are empty and never sent
    sched = ring_schedule(k, n)
    assert all(m["elements"] > 0 for m in sched)
    final = ring_states(n, sched)[-1]
    sizes = chunk_sizes(k, n)
    for row in final:
        for c, cell in enumerate(row):
            if sizes[c]:
                assert cell == frozenset(range(n))


def test_closed_form_bytes_of_naive_and_doubling() -> None:
    assert [elements_sent("naive", 10, 4, r) for r in range(4)] == [30, 10, 10, 10]
    # n = 3: rank 0 folds into rank 1 (sends once); ranks 1 and 2 do one doubling round, rank 1 returns the sum.
    assert [elements_sent("doubling", 10, 3, r) for r in range(3)] == [10, 20, 10]
    assert [elements_sent("doubling", 10, 4, r) for r in range(4)] == [20] * 4
    assert elements_sent("tree", 10, 3, 1) == 20  # the old name still means recursive doubling
    assert elements_sent("ring", 10, 1, 0) == 0
    with pytest.raises(ValueError, match="library"):
        elements_sent("library", 10, 2, 0)


def test_alpha_beta_fit_recovers_a_known_line() -> None:
    sizes = np.array([1e3, 1e4, 1e5, 1e6, 1e7])
    model = fit_alpha_beta(sizes, 50e-6 + sizes * 1e-9)
    assert math.isclose(model.alpha, 50e-6, rel_tol=1e-6)
    assert math.isclose(model.beta, 1e-9, rel_tol=1e-6)
    assert math.isclose(model.bandwidth, 1e9, rel_tol=1e-6)
    with pytest.raises(ValueError, match="two different"):
        fit_alpha_beta(np.array([8.0, 8.0]), np.array([1.0, 2.0]))


def test_cost_model_matches_textbook_formulas() -> None:
    m = AlphaBeta(alpha=1e-5, beta=1e-9)
    k, n = 1 << 20, 4
    assert math.isclose(predict_seconds(m, "ring", n, k), 2 * (n - 1) * (m.alpha + m.beta * 4 * k / n))
    assert math.isclose(predict_seconds(m, "naive", n, k), 2 * (n - 1) * (m.alpha + m.beta * 4 * k))
    assert math.isclose(predict_seconds(m, "doubling", n, k), 2 * (m.alpha + m.beta * 4 * k))
    assert predict_seconds(m, "ring", 1, k) == 0.0
    assert len(schedule_steps("doubling", 6, 100)) == 2 + 2  # 4 take part in 2 rounds, plus fold and unfold
    for n in (2, 3, 4, 5, 8):  # binomial tree: 2 ceil(log2 N) (alpha + beta B)
        rounds = math.ceil(math.log2(n))
        assert math.isclose(predict_seconds(m, "binomial", n, k), 2 * rounds * (m.alpha + m.beta * 4 * k))
    for n in (2, 4, 8):  # Rabenseifner: 2 log2 N alpha + 2 (N-1)/N B beta
        want = 2 * math.log2(n) * m.alpha + 2 * (n - 1) / n * 4 * k * m.beta
        assert math.isclose(predict_seconds(m, "halving-doubling", n, k), want)
    # N = 6 folds 2 ranks into partners first: one more step of alpha + beta B at each end
    want6 = 2 * (m.alpha + m.beta * 4 * k) + 2 * 2 * m.alpha + 2 * 3 / 4 * 4 * k * m.beta
    assert math.isclose(predict_seconds(m, "halving-doubling", 6, k), want6)
    # For large messages the ring wins over the naive star by a factor approaching n.
    assert predict_seconds(m, "naive", 8, k) / predict_seconds(m, "ring", 8, k) > 7.5
    assert math.isclose(bus_bandwidth(1e6, 2, 1e-3), 1e9)
    assert math.isnan(bus_bandwidth(1e6, 1, 1e-3))


@pytest.mark.parametrize(
    ("cls", "field", "bad"),
    [
        (AllreduceConfig, "workers", 0),
        (AllreduceConfig, "algorithm", "star"),
        (AllreduceConfig, "algorithm", 3),
        (AllreduceConfig, "elements", -1),
        (AllreduceConfig, "device", "tpu"),
        (AllreduceConfig, "timeout_s", 0.0),
        (SweepConfig, "algorithms", "ring,nope"),
        (SweepConfig, "algorithms", " , "),
        (SweepConfig, "max_log2_bytes", 1),
        (AllreduceSGDConfig, "allreduce", "mpi"),
        (AllreduceSGDConfig, "lr", -1.0),
    ],
)
def test_configs_reject_bad_values(cls: type, field: str, bad: object) -> None:
    with pytest.raises(ValueError, match=field):
        cls(**{field: bad})


def test_experiments_are_registered() -> None:
    for name in ("allreduce", "allreduce-sweep", "allreduce-sgd"):
        exp = get(name)
        assert exp.config_cls().as_dict()


def test_ring_picture_titles_count_the_messages_of_each_step() -> None:
    import matplotlib.pyplot as plt

    from dsgd_teach.collectives import draw_ring_step

    fig, ax = plt.subplots()
    sched = ring_schedule(3, 4)  # K < N: one chunk is empty, so three messages per step
    for step in range(1, 7):
        draw_ring_step(ax, 4, 3, step)
        n_msgs = sum(m["step"] == step - 1 for m in sched)
        assert f"{n_msgs} messages" in ax.get_title()
        assert len(ax.patches) == 16 + n_msgs  # 4 x 4 chunk boxes plus one arrow per message
    plt.close(fig)


def test_ring_stepper_redraws_when_the_slider_moves() -> None:
    from dsgd_teach.collectives import ring_stepper

    widget = ring_stepper(n=3, k=7)
    slider, image = widget.children[0].children[1], widget.children[1]
    assert slider.max == 4
    first = image.value
    slider.value = 2
    assert image.value[:4] == b"\x89PNG" and image.value != first
