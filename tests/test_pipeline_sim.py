"""The pipeline simulator: the bubble formula and the memory bounds at scale, and calibration from a real run."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dsgd_teach.experiments import get
from dsgd_teach.pipeline import PipelineConfig, ideal_bubble, measured_bubble
from dsgd_teach.sim.pipeline import (
    PipelineSimConfig,
    bubble_table,
    bubble_with_free_messages,
    calibrate_pipeline,
    run_pipeline_simulated,
    simulate_schedule,
    simulated_from,
)


@pytest.mark.parametrize(("p", "m"), [(1, 1), (2, 8), (5, 3), (16, 64), (64, 256)])
def test_equal_stages_and_free_messages_give_the_formula(p: int, m: int) -> None:
    for schedule in ("gpipe", "1f1b"):
        r = run_pipeline_simulated(PipelineSimConfig(stages=p, microbatches=m, schedule=schedule, link_s=0.0))
        assert r.summary["bubble"] == pytest.approx(ideal_bubble(p, m), abs=1e-9)
        assert r.summary["step_s"] == pytest.approx((m + p - 1) * 3e-3)
        held = r.trace.groupby("worker").held.max().to_numpy()
        want = [m] * p if schedule == "gpipe" else [min(p - s, m) for s in range(p)]
        np.testing.assert_array_equal(held, want)


@pytest.mark.parametrize(("p", "m"), [(2, 8), (4, 3), (64, 256)])
def test_decoupled_backwards_wait_for_no_other_stage(p: int, m: int) -> None:
    r = run_pipeline_simulated(PipelineSimConfig(stages=p, microbatches=m, schedule="decoupled", link_s=0.0))
    assert r.summary["step_s"] == pytest.approx((m + p - 1) * 1e-3 + m * 2e-3)  # only the forwards fill
    assert r.summary["bubble"] == pytest.approx(ideal_bubble(p, m, "decoupled", 2.0), abs=1e-9)
    assert r.summary["ideal_bubble"] == pytest.approx((p - 1) / (3 * m + p - 1))
    assert r.summary["bubble"] < ideal_bubble(p, m)  # below GPipe's
    gpipe = run_pipeline_simulated(PipelineSimConfig(stages=p, microbatches=m, schedule="gpipe", link_s=0.0))
    assert measured_bubble(gpipe.trace).waiting.iloc[0] == pytest.approx(ideal_bubble(p, m))  # all of it waiting


def test_replaying_a_trace_with_free_messages() -> None:
    config = PipelineConfig(stages=2, microbatches=3, schedule="gpipe")
    equal = simulate_schedule(PipelineSimConfig(stages=2, microbatches=3, schedule="gpipe", link_s=0.7))
    equal = pd.concat([equal.assign(step=1), equal.assign(step=2)])  # slow messages, equal actions
    assert bubble_with_free_messages(equal, config) == pytest.approx(ideal_bubble(2, 3))  # messages dropped
    uneven = equal.copy()
    uneven.loc[(uneven.worker == 0) & (uneven.event == "backward"), "duration"] = 4e-3  # stage 0: b = 4f
    # stage 1's first backward ends at 1 + 3 + 2 = 6 ms; stage 0's three 4 ms backwards then run back to back
    span = 6e-3 + 3 * 4e-3
    busy = (3e-3 + 12e-3) + (3e-3 + 6e-3)
    assert bubble_with_free_messages(uneven, config) == pytest.approx(1 - busy / (2 * span))


def test_naive_and_messages() -> None:
    naive = run_pipeline_simulated(PipelineSimConfig(stages=4, microbatches=3, schedule="naive", link_s=0.5))
    assert naive.summary["step_s"] == pytest.approx(3 * (4 * 3e-3 + 2 * 3 * 0.5))  # every message on the path
    trace = simulate_schedule(PipelineSimConfig(stages=3, microbatches=2, schedule="gpipe", link_s=1.0))
    f = trace[trace.event == "forward"].set_index(["worker", "microbatch"]).t_start
    assert f[(1, 0)] == pytest.approx(1e-3 + 1.0) and f[(2, 1)] == pytest.approx(3e-3 + 2 * 1.0)
    table = bubble_table(PipelineSimConfig(link_s=0.0), (2, 64), (1, 256))
    assert list(table.max_held) == [1, 2, 1, 64]  # 1F1B: min(p, m)
    with pytest.raises(ValueError, match=r"stages must be an integer in \[1, 64\]"):
        PipelineSimConfig(stages=65)
    with pytest.raises(ValueError, match=r"microbatches must be an integer in \[1, 256\]"):
        PipelineSimConfig(microbatches=257)
    assert get("pipeline-simulated").needs_cluster is False


@pytest.mark.timeout(180)
def test_calibrated_from_the_cluster(client) -> None:  # noqa: ANN001
    config = PipelineConfig(stages=2, microbatches=4, steps=3, hidden=32, batch_size=32, device="cpu")
    costs = calibrate_pipeline(config, client)
    assert costs["forward_s"] > 0 and costs["backward_s"] > 0 and costs["link_s"] >= 0
    sim = simulated_from(config.replace(schedule="naive"), costs)
    # the naive step is the sum of its parts, so the calibrated simulator reproduces the measured naive step
    predicted = run_pipeline_simulated(sim).summary["step_s"]
    assert predicted == pytest.approx(max(costs["measured_naive_step_s"], 8 * (costs["forward_s"] + costs["backward_s"])),
                                      rel=1e-6)
    big = run_pipeline_simulated(simulated_from(config, costs, stages=64, microbatches=256, schedule="1f1b"))
    assert big.summary["max_held"] == 64


def test_plots_draw_what_the_trace_holds() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from dsgd_teach.pipeline import plot_bubble, plot_held, plot_timeline

    runs = {s: run_pipeline_simulated(PipelineSimConfig(stages=3, microbatches=5, schedule=s)) for s in ("gpipe", "1f1b")}
    fig, axes = plt.subplots(1, 3)
    plot_timeline(axes[0], runs["gpipe"].trace, step=0)
    assert len(axes[0].collections) == 2 * 3 * 5  # one bar per forward and backward of every stage
    plot_held(axes[1], runs)
    heights = [bar.get_height() for bar in axes[1].patches]
    assert heights == [5, 5, 5, 3, 2, 1]
    plot_bubble(axes[2], bubble_table(PipelineSimConfig(link_s=0.0), (2,), (1, 4)))
    assert len(axes[2].get_lines()) == 2
    plt.close(fig)
