"""Chapter 06 on a live cluster: settings in effect in fresh worker-side processes, stop, errors, clean-up, panel."""

from __future__ import annotations

import os
import time

import psutil
import pytest
import torch

from dsgd_teach.experiments import get
from dsgd_teach.threads import (
    InterOpConfig,
    IntraOpConfig,
    OversubConfig,
    StreamsConfig,
    ThreadsLabConfig,
    run_inter_op,
    run_intra_op,
    run_oversubscription,
    run_streams,
    run_threads_lab,
)
from dsgd_teach.threads.fresh import _kill_group, _stacks, run_fresh, zygote_command
from dsgd_teach.trace import StopRequested, TraceRecorder

TINY = {"repeats": 1, "warmup": 0}


def _worker_state(client):
    """(pid, torch intra-op threads, inter-op threads) of every worker process."""

    def state():
        return os.getpid(), torch.get_num_threads(), torch.get_num_interop_threads()

    return client.run(state)


def _zygotes():
    out = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if "dsgd_teach.threads.zygote" in " ".join(proc.cmdline()):  # in the -c boot code
                out.append(proc)
        except psutil.NoSuchProcess:
            continue
    return out


def _no_zygote_left(timeout=15.0):
    deadline = time.monotonic() + timeout
    while _zygotes() and time.monotonic() < deadline:
        time.sleep(0.1)
    return not _zygotes()


@pytest.mark.timeout(180)
def test_intra_op_settings_are_in_effect_in_fresh_processes_and_nothing_else_changes(client):
    kernel_before = (torch.get_num_threads(), torch.get_num_interop_threads())
    workers_before = _worker_state(client)
    result = run_intra_op(IntraOpConfig(ops=("matmul", "mlp"), max_threads=3, size=32, **TINY), client)
    rows = result.trace[result.trace.event == "measure"]
    assert sorted(rows.intra_threads.unique()) == [1, 2, 3]
    assert (rows.num_threads == rows.intra_threads).all(), "requested intra-op threads not in effect"
    assert (rows.num_interop_threads == 1).all()
    assert rows.groupby("intra_threads").pid.nunique().eq(1).all()
    assert rows.pid.nunique() == 3, "each thread count must run in its own fresh process"
    worker_pids = {pid for pid, _, _ in workers_before.values()}
    assert set(rows.worker_pid) <= worker_pids, "the processes must be started by a cluster worker"
    assert not set(rows.pid) & (worker_pids | {os.getpid()})
    assert set(result.summary) >= {"matmul_ms_1t", "matmul_speedup_2t", "mlp_speedup_3t"}
    assert (torch.get_num_threads(), torch.get_num_interop_threads()) == kernel_before
    assert _worker_state(client) == workers_before
    assert _no_zygote_left()


@pytest.mark.timeout(180)
def test_inter_op_pool_sizes_and_fork_semantics(client):
    result = run_inter_op(InterOpConfig(max_interop_threads=3, width=16, depth=2, batch=4, **TINY), client)
    rows = result.trace[result.trace.event == "measure"]
    assert sorted(rows.interop_threads.unique()) == [1, 2, 3]
    assert (rows.num_interop_threads == rows.interop_threads).all(), "requested inter-op threads not in effect"
    assert (rows.num_threads == 1).all()
    assert set(rows.variant) == {"sequential", "forked", "fork_one", "eager_fork", "script_fork"}
    assert result.summary["max_abs_diff"] <= 1e-5, "forked and sequential branches must compute the same values"
    assert result.summary["eager_fork_synchronous"] == 1.0
    assert {"forked_speedup_2i", "fork_one_speedup_3i"} <= set(result.summary)


@pytest.mark.timeout(180)
def test_oversubscription_runs_p_concurrent_processes_per_configuration(client):
    result = run_oversubscription(OversubConfig(max_processes=3, max_threads=1, size=16, **TINY), client)
    rows = result.trace[result.trace.event == "measure"]
    per = rows.groupby("processes").pid.nunique().to_dict()
    assert per == {1: 1, 2: 2, 3: 3}
    assert rows.groupby("processes").zygote_pid.nunique().eq(1).all()
    assert (rows.num_threads == 1).all()
    assert {"throughput_1p1t", "throughput_3p1t", "best_processes"} <= set(result.summary)


@pytest.mark.timeout(120)
def test_stop_from_on_update_returns_partial_result_and_kills_the_processes(client):
    seen = []

    def on_update(event):
        seen.append(event)
        raise StopRequested("enough")

    result = run_intra_op(IntraOpConfig(ops=("matmul",), max_threads=8, size=16, **TINY), client, on_update)
    assert result.stopped
    assert result.trace.intra_threads.nunique() < 6  # counts(8) has 6 configurations
    assert _no_zygote_left()


@pytest.mark.timeout(120)
def test_a_failing_configuration_gives_a_clear_error_and_cleans_up(client):
    suite = {"ops": ["matmul"], "size": 16, "towers": None, "streams": None, "repeats": 1, "warmup": 0, "seed": 0}
    bad = {"intra": 1, "inter": 0, "processes": 1, "suite": suite}  # bypasses config validation on purpose
    with pytest.raises(RuntimeError, match="interop_threads=0.*failed in its fresh process"):
        run_fresh(client, [bad], TraceRecorder(), timeout_s=60)
    assert _no_zygote_left()


@pytest.mark.timeout(60)
def test_a_hung_zygote_reports_where_it_is(tmp_path):
    """The timeout message's stacks: a real zygote given no job waits in main() for its stdin line."""
    import subprocess

    with open(tmp_path / "stderr", "w+b") as errors:
        proc = subprocess.Popen(zygote_command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors,
                                start_new_session=True)
        try:
            deadline = time.monotonic() + 45
            # torch mapped means the boot line that installs the SIGUSR1 handler has run
            while "libtorch" not in open(f"/proc/{proc.pid}/maps").read():
                assert time.monotonic() < deadline and proc.poll() is None, "zygote did not start"
                time.sleep(0.1)
            while "main" not in (report := _stacks(proc, errors)):
                assert time.monotonic() < deadline and proc.poll() is None, report
        finally:
            _kill_group(proc)
    assert "where the measuring processes were" in report and "zygote.py" in report, report


@pytest.mark.timeout(60)
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU skip path")
def test_cuda_streams_skip_cleanly_without_a_gpu(client):
    result = run_streams(StreamsConfig(), client)
    assert result.summary == {"skipped": 1.0}
    assert list(result.trace.event) == ["skipped"]


@pytest.mark.gpu
@pytest.mark.timeout(120)
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_streams_compute_the_same_values_as_the_default_stream(client):
    # The run's own timeout comes before pytest's, so a hang reports the measuring processes' stacks.
    result = run_streams(StreamsConfig(chains=3, size=64, depth=3, timeout_s=60, **TINY), client)
    assert result.summary["skipped"] == 0.0
    assert result.summary["max_abs_diff"] <= 1e-4
    assert {"default_stream_ms", "streams_ms", "streams_speedup"} <= set(result.summary)


@pytest.mark.timeout(180)
def test_panel_runs_the_lab_with_the_control_values(client):
    from dsgd_teach.threads.panel import threads_panel

    panel = threads_panel(client, ThreadsLabConfig(size=128, **TINY))
    assert set(panel.controls) == {"intra_threads", "interop_threads", "size", "processes"}
    panel.controls["interop_threads"].value = 3
    panel.controls["processes"].value = 2
    panel.run_button.click()
    result = panel.wait(150)
    assert panel.error is None, panel.error
    rows = result.trace[result.trace.event == "measure"]
    chosen = rows[rows.step == 1]
    assert (chosen.num_interop_threads == 3).all() and chosen.pid.nunique() == 2
    assert (rows[rows.step == 0].num_interop_threads == 1).all()
    assert {"matmul_speedup", "towers_forked_speedup"} <= set(result.summary)


def test_experiments_are_registered():
    assert get("intra-op").run is run_intra_op
    assert get("inter-op").run is run_inter_op
    assert get("oversubscription").run is run_oversubscription
    assert get("cuda-streams").run is run_streams
    assert get("threads-lab").run is run_threads_lab
