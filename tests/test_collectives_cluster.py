"""Chapter 05 on a live cluster: every allreduce equals the sum, byte counts are exact, nothing hangs or leaks.

One four-worker cluster serves the module; each world size N forms ONE process group in which every algorithm
and every size runs, so the oracle checks stay fast.
"""

from __future__ import annotations

import time

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch
from distributed import Client

from dsgd_teach.collectives import (
    ALGORITHMS,
    HAND_WRITTEN,
    AllreduceConfig,
    AllreduceSGDConfig,
    SweepConfig,
    chunk_sizes,
    elements_sent,
    expected_sum,
    messages_from_trace,
    port_is_free,
    ring_schedule,
    run_allreduce,
    run_allreduce_sgd,
    run_sweep,
    schedule,
    verify_algorithms,
)
from dsgd_teach.collectives.cost_model import schedule_steps
from dsgd_teach.collectives.experiment import run_session
from dsgd_teach.collectives.session import Plan
from dsgd_teach.experiments import get
from dsgd_teach.runtime.ranks.group import plan_group, worker_thread_counts
from dsgd_teach.sgd import DataParallelConfig, run_data_parallel
from dsgd_teach.trace import StopRequested

SIZES = (0, 1, 2, 3, 5, 7, 10, 1001)  # includes K < N and K not divisible by N for every N in 1..4


@pytest.fixture(scope="module")
def sessions(cluster4: Client) -> dict[int, tuple]:
    """verify_algorithms for N = 1..4: (outputs, messages, spec) per N, each from one process group."""
    return {n: verify_algorithms(cluster4, n, tuple(ALGORITHMS), SIZES, seed=3, device="cpu", timeout_s=20)
            for n in (1, 2, 3, 4)}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_every_algorithm_equals_the_sum(sessions: dict, n: int) -> None:
    outputs, _, spec = sessions[n]
    assert spec.world == n and spec.backend == "gloo"
    for (algorithm, k), per_rank in outputs.items():
        truth = expected_sum(3, n, k)
        assert len(per_rank) == n
        for rank, out in enumerate(per_rank):
            assert out.shape == (k,)
            np.testing.assert_allclose(out, truth, rtol=1e-5, atol=1e-5, err_msg=f"{algorithm} k={k} rank={rank}")
        if algorithm in HAND_WRITTEN:  # every rank ends with bit-identical copies
            for out in per_rank[1:]:
                np.testing.assert_array_equal(out, per_rank[0])


@pytest.mark.timeout(240)
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_byte_counts_are_exact(sessions: dict, n: int) -> None:
    _, messages, _ = sessions[n]
    for job, (algorithm, k) in enumerate((a, k) for a in ALGORITHMS for k in SIZES):
        mine = messages[messages.job == job] if len(messages) else messages
        if algorithm == "library":
            assert len(mine) == 0  # the library's messages are invisible to us
            continue
        sent = mine[mine.direction == "send"]
        recv = mine[mine.direction == "recv"]
        for rank in range(n):
            got = int(sent[sent["rank"] == rank].elements.sum())
            assert got == elements_sent(algorithm, k, n, rank), (algorithm, k, rank)
            assert int(sent[sent["rank"] == rank].bytes.sum()) == 4 * got
        # every send has a matching receive with the same size, step and endpoints
        key = ["src", "dst", "step", "elements"]
        assert sorted(map(tuple, sent[key].values.tolist())) == sorted(map(tuple, recv[key].values.tolist()))
        # every hand-written algorithm sends exactly the messages its schedule lists
        logged_steps = sorted((m.step, m.phase, m.src, m.dst, m.elements) for m in sent.itertuples())
        assert logged_steps == sorted(
            (m["step"], m["phase"], m["src"], m["dst"], m["elements"]) for m in schedule(algorithm, k, n)
        ), (algorithm, k, n)
        if algorithm == "ring":
            logged = {(m.step, m.src, m.dst, m.chunk, m.elements) for m in sent.itertuples()}
            planned = {(m["step"], m["src"], m["dst"], m["chunk"], m["elements"]) for m in ring_schedule(k, n)}
            assert logged == planned
            if k % n == 0 and n > 1:
                per_rank = sent.groupby("rank").elements.sum()
                assert (per_rank == 2 * (n - 1) * k // n).all()
            if n > 1 and len(sent):
                assert int(sent.elements.max()) == max(chunk_sizes(k, n))  # K/N per message, never the whole K
        # the cost model's schedule has as many sequential steps as the algorithm really took
        if len(sent):
            per_step = sent.groupby("step").bytes.max()
            assert sorted(per_step.tolist(), reverse=True) == sorted(
                [b for b in schedule_steps(algorithm, n, k) if b > 0], reverse=True
            )


@pytest.mark.timeout(120)
def test_run_allreduce_trace_and_ring_visual_from_real_messages(cluster4: Client) -> None:
    config = AllreduceConfig(workers=3, algorithm="ring", elements=10, repeats=2, device="cpu", seed=1)
    result = run_allreduce(config, cluster4)
    assert not result.stopped
    np.testing.assert_allclose(result.params, expected_sum(1, 3, 10), rtol=1e-5, atol=1e-5)
    assert result.summary["max_abs_error"] < 1e-5
    msgs = messages_from_trace(result.trace)
    planned = ring_schedule(10, 3)
    assert sorted(map(lambda m: sorted(m.items()), msgs)) == sorted(map(lambda m: sorted(m.items()), planned))
    timed = result.trace[result.trace.event == "allreduce"]
    assert len(timed) == 2 * 3  # repeats x ranks
    assert result.summary["max_bytes_sent_per_rank"] == 4 * max(elements_sent("ring", 10, 3, r) for r in range(3))
    fig = get("allreduce").plot(result)  # what `dsgd-teach run allreduce` saves
    assert len(fig.axes) == 2
    plt.close(fig)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("n", [3, 4])
def test_link_loads_the_chapter_states(cluster4: Client, n: int) -> None:
    """Chapter 05's sentences about links, checked against the traced messages of real runs."""
    from dsgd_teach.collectives.plots import link_matrix

    k = 24  # divisible by 3 and 4
    mats = {a: link_matrix(run_allreduce(AllreduceConfig(workers=n, algorithm=a, elements=k, repeats=1,
                                                         device="cpu"), cluster4).trace)
            for a in ("naive", "ring", "halving-doubling")}
    ring = mats["ring"]
    for r in range(n):  # each ring link carries 2(N-1)K/N numbers, about 2K; no other link is used
        assert ring[r, (r + 1) % n] == 4 * 2 * (n - 1) * k // n
    assert ring.sum() == n * 4 * 2 * (n - 1) * k // n
    star = mats["naive"]  # the server sends (N-1)K and receives (N-1)K: per direction, N/2 times a ring rank
    assert star[0].sum() == star[:, 0].sum() == 4 * (n - 1) * k
    assert star[0].sum() / ring[0].sum() == n / 2
    assert star[1:, 1:].sum() == 0
    if n == 4:  # halving-doubling sends the ring's 2(N-1)K/N per rank, over log2 N partners
        assert (mats["halving-doubling"].sum(axis=1) == 4 * 2 * (n - 1) * k // n).all()


@pytest.mark.timeout(120)
def test_a_deadlocking_algorithm_fails_within_the_timeout(cluster4: Client) -> None:
    t = time.monotonic()
    with pytest.raises(RuntimeError, match="rank"):
        run_session(cluster4, 2, Plan(jobs=(("recv-first", 8),)), device="cpu", timeout_s=2.0, run_timeout_s=60)
    assert time.monotonic() - t < 60
    # the group is gone on every worker afterwards, and a normal run works again
    deadline = time.monotonic() + 20
    while any(cluster4.run(torch.distributed.is_initialized).values()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(cluster4.run(torch.distributed.is_initialized).values())
    result = run_allreduce(AllreduceConfig(workers=2, elements=64, repeats=1, device="cpu"), cluster4)
    assert result.summary["max_abs_error"] < 1e-5


@pytest.mark.timeout(120)
def test_group_port_and_threads_are_released(cluster4: Client) -> None:
    config = AllreduceConfig(workers=4, algorithm="ring", elements=4096, repeats=2, device="cpu")
    run_allreduce(config, cluster4)  # warm-up: the first group may start long-lived pools
    time.sleep(0.5)
    baseline = worker_thread_counts(cluster4)
    result = run_allreduce(config, cluster4)
    port = result.summary["port"]
    assert port_is_free("127.0.0.1", port)  # nobody listens on the rendezvous port any more
    first = sorted(cluster4.scheduler_info()["workers"])[0]
    assert cluster4.submit(port_is_free, "127.0.0.1", port, workers=[first], pure=False).result(timeout=30)
    assert not any(cluster4.run(torch.distributed.is_initialized).values())
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        now = worker_thread_counts(cluster4)
        if all(now[w][0] <= baseline[w][0] and now[w][1] <= baseline[w][1] for w in baseline):
            break
        time.sleep(0.25)
    assert all(now[w][0] <= baseline[w][0] and now[w][1] <= baseline[w][1] for w in baseline), (baseline, now)


@pytest.mark.timeout(120)
def test_stop_ends_every_rank_together(cluster4: Client) -> None:
    seen: list[dict] = []

    def on_update(event: dict) -> None:
        seen.append(event)
        if event["event"] == "allreduce":
            raise StopRequested

    config = AllreduceConfig(workers=2, elements=1000, repeats=500, device="cpu")
    result = run_allreduce(config, cluster4, on_update=on_update)
    assert result.stopped
    assert (result.trace.event == "allreduce").sum() < 2 * 500
    assert not any(cluster4.run(torch.distributed.is_initialized).values())


@pytest.mark.timeout(180)
def test_ring_sgd_follows_the_library_curve(cluster4: Client) -> None:
    base = AllreduceSGDConfig(workers=3, steps=25, eval_every=5, batch_size=16, device="cpu", seed=2)
    ring = run_allreduce_sgd(base, cluster4)
    lib = run_allreduce_sgd(base.replace(allreduce="library"), cluster4)
    curves = [r.trace[r.trace.event == "update"].sort_values("step").loss.to_numpy() for r in (ring, lib)]
    assert len(curves[0]) == len(curves[1]) == 25
    np.testing.assert_allclose(curves[0], curves[1], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ring.params, lib.params, rtol=1e-5, atol=1e-6)
    assert ring.summary["max_rank_divergence"] == 0.0  # every rank applied the very same update
    # and both agree with chapter 01's driver-averaged data parallelism (same batches, same rows)
    dp = run_data_parallel(DataParallelConfig(workers=3, steps=25, eval_every=5, batch_size=16, seed=2), cluster4)
    np.testing.assert_allclose(ring.params, dp.params, rtol=1e-4, atol=1e-5)
    sent = ring.trace[ring.trace.event == "allreduce"]
    k = len(ring.params) + 3  # gradient plus loss, rows and the stop flag
    for rank in range(3):
        assert set(sent[sent.worker == rank].bytes_sent) == {4 * elements_sent("ring", k, 3, rank)}


@pytest.mark.timeout(180)
def test_sweep_fits_a_cost_model(cluster4: Client) -> None:
    config = SweepConfig(workers=2, algorithms="ring,library", min_log2_bytes=10, max_log2_bytes=14, repeats=1,
                         pingpong_repeats=2, device="cpu")
    result = run_sweep(config, cluster4)
    assert result.summary["alpha_us"] >= 0 and result.summary["beta"] >= 0
    timed = result.trace[(result.trace.event == "allreduce") & (result.trace.worker == 0)]
    assert set(timed.nbytes) == set(config.sizes_bytes)
    assert timed[timed.algorithm == "ring"].predicted_seconds.notna().all()
    assert timed[timed.algorithm == "library"].predicted_seconds.isna().all()
    assert len(result.extras.pingpong) >= 3 and result.extras.pingpong.nbytes.max() >= 2**20
    fig = get("allreduce-sweep").plot(result)
    assert len(fig.axes) == 1 and fig.axes[0].get_lines()
    plt.close(fig)


@pytest.mark.timeout(60)
def test_too_few_workers_is_a_clear_error(cluster4: Client) -> None:
    with Client(cluster4.scheduler.address, timeout="20s") as plain:  # not a course client: cannot resize
        with pytest.raises(ValueError, match="one per worker"):
            plan_group(plain, 5, "cpu")
    with pytest.raises(ValueError, match="a GPU of its own for each of the 2 ranks.*use device=.cpu."):
        if torch.cuda.is_available():
            pytest.skip("this machine has a GPU")
        plan_group(cluster4, 2, "cuda")


@pytest.mark.timeout(120)
def test_panel_runs_an_allreduce_and_draws_it(cluster4: Client) -> None:
    import ipywidgets as widgets

    from dsgd_teach.collectives import plot_allreduce_live
    from dsgd_teach.panel import ExperimentPanel

    panel = ExperimentPanel(
        cluster4, run_allreduce, AllreduceConfig(repeats=2, elements=1000, device="cpu"),
        controls={"workers": widgets.IntSlider(value=3, min=1, max=4),
                  "algorithm": widgets.Dropdown(options=list(ALGORITHMS), value="naive")},
        plot=plot_allreduce_live, resize_cluster=False,
    )
    panel.start()
    result = panel.wait(100)
    assert panel.error is None, panel.error
    assert result.config.workers == 3 and result.config.algorithm == "naive"
    assert result.summary["max_abs_error"] < 1e-5
    assert len(panel.figure.axes) == 2  # bytes per link and time per repeat were drawn
