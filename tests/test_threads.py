"""Chapter 06 without a cluster: config validation, the sweep and table arithmetic, the fork semantics, the zygote."""

from __future__ import annotations

import json
import os
import subprocess
import threading

import numpy as np
import pandas as pd
import pytest
import torch

from dsgd_teach.threads import (
    InterOpConfig,
    IntraOpConfig,
    OversubConfig,
    StreamsConfig,
    ThreadsLabConfig,
    counts,
    intra_table,
    oversub_table,
)
from dsgd_teach.threads.fresh import zygote_command
from dsgd_teach.threads.lines import LineReader
from dsgd_teach.threads.towers import build, eager_fork_demo, script_launch_demo, tower_benches
from dsgd_teach.threads.workloads import median_time, op_benches


@pytest.mark.parametrize(
    ("cls", "kwargs", "field"),
    [
        (IntraOpConfig, {"ops": ("fft",)}, "ops"),
        (IntraOpConfig, {"ops": "matmul,fft"}, "ops"),
        (IntraOpConfig, {"ops": ()}, "ops"),
        (IntraOpConfig, {"ops": ["matmul"]}, "ops"),
        (IntraOpConfig, {"ops": ("matmul", "matmul")}, "ops"),
        (IntraOpConfig, {"max_threads": 0}, "max_threads"),
        (IntraOpConfig, {"size": 8}, "size"),
        (IntraOpConfig, {"size": True}, "size"),
        (IntraOpConfig, {"repeats": 0}, "repeats"),
        (InterOpConfig, {"max_interop_threads": 65}, "max_interop_threads"),
        (InterOpConfig, {"intra_threads": 0}, "intra_threads"),
        (InterOpConfig, {"width": 2.5}, "width"),
        (OversubConfig, {"max_processes": 17}, "max_processes"),
        (OversubConfig, {"max_processes": 16, "size": 4096}, "processes"),
        (OversubConfig, {"timeout_s": 1.0}, "timeout_s"),
        (ThreadsLabConfig, {"processes": 0}, "processes"),
        (ThreadsLabConfig, {"interop_threads": "2"}, "interop_threads"),
        (StreamsConfig, {"chains": 0}, "chains"),
    ],
)
def test_bad_inputs_raise_a_clear_error_naming_the_field(cls, kwargs, field):
    with pytest.raises(ValueError, match=field):
        cls(**kwargs)


def test_ops_accept_a_comma_separated_string():
    assert IntraOpConfig(ops="matmul, conv").ops == ("matmul", "conv")


def test_configs_are_frozen_and_replace_revalidates():
    cfg = ThreadsLabConfig()
    with pytest.raises(AttributeError):
        cfg.processes = 3
    assert cfg.replace(processes=3).processes == 3
    with pytest.raises(ValueError, match="size"):
        cfg.replace(size=1)


def test_sweep_counts():
    assert counts(1) == [1]
    assert counts(2) == [1, 2]
    assert counts(6) == [1, 2, 3, 4, 6]
    assert counts(16) == [1, 2, 3, 4, 8, 16]


def test_median_time_calls_the_work_once_per_repeat():
    calls = []
    median, fastest = median_time(lambda: calls.append(1), 5)
    assert len(calls) == 5 and 0 <= fastest <= median


def _row(proc, threads, seconds, cores=2, **extra):
    return {"event": "measure", "processes": proc, "intra_threads": threads, "seconds": seconds, "cores": cores,
            "num_threads": threads, "num_interop_threads": 1, "pid": 100 + proc * 10 + threads, **extra}


def test_oversubscription_table_arithmetic():
    # per-op seconds: one lone process 1.0; each of 2 processes at 2 threads 2.0 (P x T = 4 > 2 cores)
    trace = pd.DataFrame([_row(1, 1, 1.0), _row(1, 2, 0.5), _row(2, 1, 1.0), _row(2, 1, 1.0), _row(2, 2, 2.0)])
    table = oversub_table(trace, cores=2).set_index(["processes", "threads"])
    assert table.throughput.to_dict() == {(1, 1): 1.0, (1, 2): 2.0, (2, 1): 2.0, (2, 2): 1.0}
    assert table.ideal.to_dict() == {(1, 1): 1.0, (1, 2): 2.0, (2, 1): 2.0, (2, 2): 2.0}
    assert table.oversubscribed.to_dict() == {(1, 1): False, (1, 2): False, (2, 1): False, (2, 2): True}
    assert table.rule.to_dict() == {(1, 1): False, (1, 2): True, (2, 1): True, (2, 2): False}


def test_intra_table_speedup_and_ideal():
    trace = pd.DataFrame([_row(1, 1, 0.3, workload="matmul"), _row(1, 2, 0.2, workload="matmul"),
                          _row(1, 1, 0.1, workload="conv"), _row(1, 2, 0.1, workload="conv")])
    table = intra_table(trace).set_index(["op", "threads"])
    np.testing.assert_allclose(table.speedup.to_numpy(), [1.0, 1.0, 1.0, 1.5])
    assert table.ideal.to_dict() == {("conv", 1): 1.0, ("conv", 2): 2.0, ("matmul", 1): 1.0, ("matmul", 2): 2.0}


def test_workloads_are_deterministic_from_the_seed():
    a = op_benches(["matmul"], 32, seed=3, warmup=0)[0].fn()
    b = op_benches(["matmul"], 32, seed=3, warmup=0)[0].fn()
    c = op_benches(["matmul"], 32, seed=4, warmup=0)[0].fn()
    assert torch.equal(a, b) and not torch.equal(a, c)


@pytest.mark.timeout(60)
def test_forked_and_sequential_towers_compute_the_same_values():
    before = (torch.get_num_threads(), torch.get_num_interop_threads())
    model, scripted, x = build(width=24, depth=3, batch=5, seed=0)
    with torch.no_grad():
        reference = model.sequential(x)  # eager, no fork at all
        for variant in ("sequential", "forked", "fork_one"):
            torch.testing.assert_close(getattr(scripted, variant)(x), reference, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(script_launch_demo(scripted, x)["out"], reference[:, :24], rtol=1e-5, atol=1e-6)
    benches = tower_benches(24, 3, 5, seed=0, warmup=1)
    diffs = {b.variant: b.extra["max_abs_diff"] for b in benches}
    assert set(diffs) == {"sequential", "forked", "fork_one", "eager_fork", "script_fork"}
    assert max(diffs.values()) <= 1e-5
    assert (torch.get_num_threads(), torch.get_num_interop_threads()) == before


def test_eager_fork_runs_synchronously_on_the_calling_thread():
    model, _, x = build(width=16, depth=2, batch=4, seed=1)
    with torch.no_grad():
        demo = eager_fork_demo(model, x)
        assert demo["done_at_return"] is True
        assert demo["same_thread"] is True
        torch.testing.assert_close(demo["out"], model.sequential(x), rtol=0, atol=0)


def test_line_reader_handles_partial_lines_timeouts_and_eof():
    r, w = os.pipe()
    reader = LineReader(r)
    try:
        os.write(w, b"hel")
        assert reader.read_line(0.05) is None and not reader.eof
        os.write(w, b"lo\nwor")
        assert reader.read_line(1.0) == "hello"
        threading.Timer(0.05, lambda: os.write(w, b"ld\n")).start()
        assert reader.read_line(5.0) == "world"
        os.close(w)
        w = -1
        assert reader.read_line(1.0) is None and reader.eof
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)


def _zygote(job, timeout=120):
    proc = subprocess.run(zygote_command(), input=json.dumps(job) + "\n",
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]


def _suite(**kw):
    return {"ops": ["matmul"], "size": 16, "towers": None, "streams": None, "repeats": 1, "warmup": 0, "seed": 0, **kw}


@pytest.mark.timeout(150)
def test_zygote_children_run_with_the_requested_pools_in_their_own_processes():
    job = {"timeout_s": 60, "configs": [
        {"intra": 2, "inter": 3, "processes": 2, "suite": _suite()},
        {"intra": 1, "inter": 1, "processes": 1, "suite": _suite(towers={"width": 8, "depth": 1, "batch": 2})},
        {"intra": 0, "inter": 1, "processes": 1, "suite": _suite()},  # torch refuses 0 threads: a clear error
    ]}
    first, second, bad = _zygote(job)
    rows = first["rows"]
    assert len(rows) == 2 and {r["proc"] for r in rows} == {0, 1}
    assert all(r["num_threads"] == 2 and r["num_interop_threads"] == 3 for r in rows)
    pids = {r["pid"] for r in rows}
    assert len(pids) == 2 and os.getpid() not in pids and first["zygote_pid"] not in pids
    assert all(r["zygote_pid"] == first["zygote_pid"] for r in rows)
    assert first["worker_pid"] == os.getpid()  # the zygote's parent is whoever started it (here: this test)
    towers = {r["variant"]: r for r in second["rows"] if r["workload"] == "towers"}
    assert towers["eager_fork"]["done_at_return"] and towers["eager_fork"]["same_thread"]
    assert max(r["max_abs_diff"] for r in towers.values()) <= 1e-5
    assert not pids & {r["pid"] for r in second["rows"]}, "each configuration must get a fresh process"
    assert "error" in bad and "thread" in bad["error"].lower()


@pytest.mark.timeout(150)
def test_a_failed_configuration_reports_its_own_error_not_a_broken_pipe():
    """A child that fails exits at once; telling it to stop must not replace its error (it did in 12 of 40)."""
    bad = {"intra": 0, "inter": 1, "processes": 1, "suite": _suite()}
    replies = _zygote({"timeout_s": 60, "configs": [bad] * 20})
    assert len(replies) == 20
    assert all("set_num_threads" in r.get("error", "") for r in replies), [r.get("error") for r in replies]


def test_plots_draw_from_empty_and_partial_traces():
    from matplotlib.figure import Figure

    from dsgd_teach.threads import plot_interop, plot_intra, plot_lab, plot_oversub, plot_streams
    from dsgd_teach.trace import to_frame

    partial = to_frame([
        {**_row(1, 1, 0.3, workload="matmul", variant="", step=0), "interop_threads": 1},
        {**_row(1, 1, 0.2, workload="towers", variant="sequential", step=0), "interop_threads": 1},
        {**_row(1, 1, 0.1, workload="towers", variant="forked", step=0), "interop_threads": 1},
    ])
    for plot in (plot_intra, plot_interop, plot_oversub, plot_lab, plot_streams):
        for trace in (to_frame([]), partial):
            fig = Figure()
            plot(fig, trace)
            assert fig.axes, f"{plot.__name__} drew nothing"
