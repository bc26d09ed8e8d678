"""Chapter 07 on a live cluster: every schedule trains exactly like one process, holds what it claims, never hangs.

One four-worker cluster serves the module; each run forms its own process group of `stages` ranks.
"""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest
import torch
from distributed import Client

from dsgd_teach.collectives import elements_sent, port_is_free
from dsgd_teach.pipeline import PipelineConfig, reference_training, run_pipeline
from dsgd_teach.pipeline.one_f_one_b import warmup
from dsgd_teach.runtime.clusters.cluster import start_client
from dsgd_teach.runtime.ranks.live import WorkerLost
from dsgd_teach.tensor_parallel.megatron import (
    TensorParallelConfig,
    column_slice,
    dense_block,
    run_tensor_parallel,
)
from dsgd_teach.trace import StopRequested

SMALL = PipelineConfig(depth=6, hidden=16, steps=2, batch_size=20, lr=0.2, device="cpu", timeout_s=20, seed=1)


def _assert_matches_reference(result, config: PipelineConfig) -> None:  # noqa: ANN001
    params, grads, losses = reference_training(config)
    tag = f"{config.schedule} p={config.stages} m={config.microbatches}"
    np.testing.assert_allclose(result.params, params, rtol=1e-5, atol=1e-6, err_msg=f"params {tag}")
    np.testing.assert_allclose(result.extras.grads, grads, rtol=1e-5, atol=1e-6, err_msg=f"grads {tag}")
    curve = result.trace[result.trace.event == "update"].sort_values("step").loss.to_numpy()
    np.testing.assert_allclose(curve, losses, rtol=1e-5, atol=1e-6, err_msg=f"loss {tag}")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("schedule", ["naive", "gpipe", "1f1b"])
def test_every_schedule_equals_single_process_training(cluster4: Client, schedule: str) -> None:
    for p in (1, 2, 3, 4):
        for m in range(1, 9):  # m < p, m = p, m not a multiple of p, m a multiple of p
            config = SMALL.replace(stages=p, microbatches=m, schedule=schedule)
            result = run_pipeline(config, cluster4)
            assert not result.stopped and result.summary["backend"] == "gloo"
            _assert_matches_reference(result, config)
            held = result.trace[result.trace.event.isin(["forward", "backward"])].groupby("worker").held.max()
            assert list(held.index) == list(range(p))
            for s in range(p):  # activations held per stage, counted in the trace
                want = {"naive": 1, "gpipe": m, "1f1b": min(warmup(p, m, s) + 1, m)}[schedule]
                assert held[s] == want == result.extras.peak_held[s], (schedule, p, m, s)
            if schedule == "1f1b":
                assert held.max() <= p


@pytest.mark.timeout(120)
def test_the_course_cnn_splits_into_four_stages(cluster4: Client) -> None:
    config = SMALL.replace(model="cnn", stages=4, microbatches=5, schedule="1f1b", steps=3)
    result = run_pipeline(config, cluster4)
    _assert_matches_reference(result, config)
    sends = result.trace[result.trace.event == "send"]
    assert set(sends.worker) == {0, 1, 2, 3} and (sends.bytes_sent > 0).all()


@pytest.mark.timeout(180)
def test_decoupled_with_delay_zero_is_the_exact_pipeline(cluster4: Client) -> None:
    exact = run_pipeline(SMALL.replace(stages=3, microbatches=4, steps=6), cluster4)
    zero = run_pipeline(SMALL.replace(stages=3, microbatches=4, steps=6, schedule="decoupled", gradient_delay=0),
                        cluster4)
    np.testing.assert_allclose(zero.params, exact.params, rtol=1e-6, atol=1e-7)
    delayed_cfg = SMALL.replace(stages=3, microbatches=4, steps=6, schedule="decoupled", gradient_delay=1)
    delayed = run_pipeline(delayed_cfg, cluster4)
    _assert_matches_reference(delayed, delayed_cfg)  # stage s applies the gradient of step t-(2-s)
    assert np.abs(delayed.params - exact.params).max() > 1e-4  # and that is a different trajectory
    updates = delayed.trace[delayed.trace.event.isin(["update", "stage_update"])]
    assert set(updates.groupby("worker").staleness.first()) == {2, 1, 0}
    stopped = run_pipeline(delayed_cfg.replace(steps=500, gradient_delay=2), cluster4,
                           on_update=_stop_after_first_update)  # gradients already sent are drained, no hang
    assert stopped.stopped and stopped.summary["steps"] < 500
    assert not any(cluster4.run(torch.distributed.is_initialized).values())
    hybrid_cfg = delayed_cfg.replace(stages=2, replicas=2, microbatches=3, steps=5)
    _assert_matches_reference(run_pipeline(hybrid_cfg, cluster4), hybrid_cfg)


def _stop_after_first_update(event: dict) -> None:
    if event["event"] == "update":
        raise StopRequested


@pytest.mark.timeout(120)
def test_decoupled_stages_start_their_backward_before_the_next_stage_has_finished_its_own(cluster4: Client) -> None:
    """No backward locking: in GPipe, stage 0 needs stage 1's first backward of the step before its own can start."""
    # Microbatches long enough that the OS's time slices on a loaded machine cannot reorder the two stages'
    # backwards when nothing waited, and 24 measured steps: hidden 256 and 8 steps measured 0.5 in 1 of 16 runs
    # beside two busy processes on 2 cores (hidden 256 and 24 steps: min 0.71; hidden 512 and 24 steps: min 0.96)
    config = SMALL.replace(stages=2, microbatches=4, hidden=512, depth=8, batch_size=256, steps=25)
    work = {}
    for schedule in ("gpipe", "decoupled"):
        trace = run_pipeline(config.replace(schedule=schedule), cluster4).trace
        backward = trace[(trace.event == "backward") & (trace.step >= 1)]
        first_start = backward.groupby(["step", "worker"]).t_start.min().unstack()
        first_end = (backward.t_start + backward.duration).groupby([backward.step, backward.worker]).min().unstack()
        work[schedule] = (first_start[0] < first_end[1]).mean()  # share of steps stage 0 did not wait for stage 1
    assert work["gpipe"] == 0.0
    assert work["decoupled"] >= 0.75, work


@pytest.mark.timeout(120)
def test_group_port_and_stop_are_released(cluster4: Client) -> None:
    result = run_pipeline(SMALL.replace(stages=3, microbatches=3), cluster4)
    port = result.summary["port"]
    assert port_is_free("127.0.0.1", port)
    assert not any(cluster4.run(torch.distributed.is_initialized).values())

    def stop_after_first_update(event: dict) -> None:
        if event["event"] == "update":
            raise StopRequested

    stopped = run_pipeline(SMALL.replace(stages=2, steps=500), cluster4, on_update=stop_after_first_update)
    assert stopped.stopped and stopped.summary["steps"] < 500
    assert not any(cluster4.run(torch.distributed.is_initialized).values())


@pytest.fixture(scope="module")
def own():
    """A private two-worker cluster for the fault tests: they freeze and kill its workers."""
    with start_client(2, quiet=True, use_gpu=False) as c:
        yield c


#: Short enough to keep the test quick, long enough that no wait of a busy machine's healthy stages reaches it
#: (at 2 s, a stage starved by other work failed first in one of two runs beside two busy loops).
TIMEOUT_S = 6.0


@pytest.mark.timeout(120)
def test_a_stalled_stage_makes_its_neighbours_receive_time_out_loudly(own: Client) -> None:
    """A frozen stage (SIGSTOP: alive to the scheduler, silent to its neighbour) trips stage 0's receive timeout."""
    _, stalled = sorted(own.scheduler_info()["workers"])
    pid = own.run(os.getpid)[stalled]
    frozen: list[float] = []

    def freeze_stage1(event: dict) -> None:
        if not frozen and event.get("worker") == 1 and event["event"] == "forward":
            frozen.append(time.monotonic())
            os.kill(pid, signal.SIGSTOP)

    config = SMALL.replace(stages=2, steps=100_000, timeout_s=TIMEOUT_S)
    try:
        # whichever wait stage 0 is in when its neighbour freezes (a receive, the vote on stopping, or, on a busy
        # machine where stage 0 starts late, forming the stages' groups) fails after the timeout, and says so
        loud = (r"rank 0 .*(stage 0: receive of .* from stage 1|rank 0: the vote on stopping"
                r"|stage 0: forming a process group with the other stages) .*6\.0 s \(is a")
        with pytest.raises(RuntimeError, match=loud) as caught:
            run_pipeline(config, own, on_update=freeze_stage1)
        assert not isinstance(caught.value, WorkerLost)  # nobody died: the timeout, not the scheduler, ended it
        assert frozen and time.monotonic() - frozen[0] < TIMEOUT_S + 8  # the timeout plus the driver's polling
    finally:
        os.kill(pid, signal.SIGCONT)
    # resumed, the frozen stage times out in its turn; both then leave their process group
    deadline = time.monotonic() + 30
    while any(own.run(torch.distributed.is_initialized).values()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(own.run(torch.distributed.is_initialized).values())


@pytest.mark.timeout(180)
def test_a_killed_stage_ends_the_run_with_a_clear_error(own: Client) -> None:
    survivor, doomed = sorted(own.scheduler_info()["workers"])
    pids = own.run(os.getpid)
    killed: list[float] = []

    def kill_stage1(event: dict) -> None:
        if not killed and event.get("worker") == 1 and event["event"] == "forward":
            killed.append(time.monotonic())
            os.kill(pids[doomed], signal.SIGKILL)

    config = SMALL.replace(stages=2, steps=100_000, timeout_s=5.0)
    with pytest.raises(WorkerLost, match="rank 1"):
        run_pipeline(config, own, on_update=kill_stage1)
    assert killed and time.monotonic() - killed[0] < 10  # noticed within seconds
    # stage 0's receive failed loudly within its timeout, and it left its process group
    deadline = time.monotonic() + 30
    while own.run(torch.distributed.is_initialized, workers=[survivor])[survivor] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not own.run(torch.distributed.is_initialized, workers=[survivor])[survivor]
    assert own.submit(os.getpid, workers=[survivor], pure=False).result(timeout=30) == pids[survivor]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("allreduce", ["ring", "library"])
def test_tensor_parallel_block_equals_the_dense_one(cluster4: Client, allreduce: str) -> None:
    for n in (1, 2, 3, 4):
        config = TensorParallelConfig(workers=n, rows=6, d_in=5, d_hidden=11, d_out=7, allreduce=allreduce,
                                      device="cpu", seed=4)
        result = run_tensor_parallel(config, cluster4)
        dense = dense_block(config)
        for r, out in enumerate(result.extras.outputs):
            cols = column_slice(config.d_hidden, n, r)
            np.testing.assert_allclose(out["Y"], dense["Y"], rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(out["dX"], dense["dX"], rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(out["dA"], dense["dA"][:, cols], rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(out["dB"], dense["dB"][cols, :], rtol=1e-5, atol=1e-5)
        if allreduce == "ring":  # one allreduce of Y forward, one of dX backward, bytes exactly as chapter 05's
            trace = result.trace
            for r in range(n):
                fwd = trace[(trace.event == "forward") & (trace.worker == r)].bytes_sent.item()
                bwd = trace[(trace.event == "backward") & (trace.worker == r)].bytes_sent.item()
                assert fwd == 4 * elements_sent("ring", 6 * 7, n, r)
                assert bwd == 4 * elements_sent("ring", 6 * 5, n, r)


@pytest.mark.timeout(120)
def test_hybrid_two_stages_by_two_replicas_equals_single_process(cluster4: Client) -> None:
    for schedule in ("gpipe", "1f1b"):
        config = SMALL.replace(stages=2, replicas=2, microbatches=3, schedule=schedule, steps=3)
        result = run_pipeline(config, cluster4)
        _assert_matches_reference(result, config)
        assert result.summary["max_replica_divergence"] == 0.0
        reduces = result.trace[result.trace.event == "allreduce"]
        assert set(reduces.worker) == {0, 1, 2, 3} and len(reduces) == 4 * config.steps


@pytest.mark.timeout(120)
def test_panel_runs_a_pipeline_and_draws_its_timeline(cluster4: Client) -> None:
    import ipywidgets as widgets

    from dsgd_teach.panel import ExperimentPanel
    from dsgd_teach.pipeline import plot_pipeline_live

    panel = ExperimentPanel(
        cluster4, run_pipeline, SMALL.replace(steps=4),
        controls={"stages": widgets.IntSlider(value=3, min=1, max=4),
                  "schedule": widgets.Dropdown(options=["naive", "gpipe", "1f1b", "decoupled"], value="1f1b"),
                  "gradient_delay": widgets.IntSlider(value=1, min=0, max=4)},
        plot=plot_pipeline_live, resize_cluster=False,
    )
    panel.start()
    result = panel.wait(100)
    assert panel.error is None, panel.error
    assert result.config.stages == 3 and result.config.schedule == "1f1b"
    assert len(panel.figure.axes) == 2 and len(panel.figure.axes[0].collections) > 0  # the timeline was drawn


@pytest.mark.timeout(120)
def test_a_stop_ends_every_stage_after_the_same_step_soon_after_it_was_asked(cluster4: Client) -> None:
    """The stages vote on stopping only every few steps (about every VOTE_EVERY_S), yet all stop together."""
    asked: list[int] = []

    def stop_after_tenth_update(event: dict) -> None:
        if event["event"] == "update" and event["step"] >= 10:
            asked.append(event["step"])
            raise StopRequested

    config = SMALL.replace(stages=3, microbatches=2, steps=100_000, schedule="1f1b")
    stopped = run_pipeline(config, cluster4, on_update=stop_after_tenth_update)
    assert stopped.stopped and asked
    last = stopped.trace[stopped.trace.event == "forward"].groupby("worker").step.max()
    assert last.nunique() == 1, last.to_dict()  # every stage stopped after the same step
    assert last.iloc[0] < 100_000 - 1
