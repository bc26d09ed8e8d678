"""Worker memory limits fit the torch build installed, and a paused or starved worker is a clear error, not a hang."""

from __future__ import annotations

import threading
import time

import pytest

from dsgd_teach import memory
from dsgd_teach.memory import (
    BINDER_BUDGET_BYTES,
    WORKING_ROOM_BYTES,
    MiB,
    WorkerMemoryError,
    plan_worker_memory,
    worker_baseline,
)
from dsgd_teach.runtime.clusters.cluster import start_client, worker_addresses
from dsgd_teach.runtime.ranks import live
from dsgd_teach.sgd import DataParallelConfig, run_data_parallel
from dsgd_teach.trace import TraceRecorder

CPU_WHEEL = 281 * MiB  # a worker's resident memory after its imports, torch 2.13.0+cpu (measured)
CUDA_WHEEL = 730 * MiB  # the same with PyPI's standard Linux wheel, 2.13.0+cu130, no GPU (measured)


@pytest.mark.parametrize("baseline", [CPU_WHEEL, CUDA_WHEEL], ids=["cpu-wheel", "cuda-wheel"])
@pytest.mark.parametrize("machine_gib", [4, 8, 24])
@pytest.mark.parametrize("n", [1, 2, 4])
def test_every_worker_has_working_room_above_its_imports(baseline, machine_gib, n):
    plan = plan_worker_memory(n, baseline=baseline, machine=machine_gib * 1024**3)
    assert plan.headroom >= WORKING_ROOM_BYTES - 1, plan
    assert plan.limit * plan.pause_fraction > baseline


def test_binder_budget_still_met_with_the_cpu_wheel():
    plan = plan_worker_memory(2, baseline=CPU_WHEEL, machine=BINDER_BUDGET_BYTES)
    assert 2 * plan.limit + CPU_WHEEL <= BINDER_BUDGET_BYTES  # two workers at their limits plus the kernel
    assert plan.headroom >= WORKING_ROOM_BYTES - 1


def test_limits_grow_with_the_machine():
    small = plan_worker_memory(2, baseline=CPU_WHEEL, machine=BINDER_BUDGET_BYTES).limit
    large = plan_worker_memory(2, baseline=CPU_WHEEL, machine=24 * 1024**3).limit
    assert large > 2 * small


def test_a_machine_too_small_for_the_imports_is_refused_with_figures():
    with pytest.raises(WorkerMemoryError, match=r"(?s)2 worker\(s\).*2190 MiB.*2048 MiB.*fewer workers"):
        plan_worker_memory(2, baseline=CUDA_WHEEL, machine=BINDER_BUDGET_BYTES)


def test_the_installed_builds_baseline_fits_the_default_limit():
    """The measured footprint of this environment's workers (the CUDA wheel's is 2.5x the CPU wheel's) fits."""
    baseline = worker_baseline()
    assert 100 * MiB < baseline < 4096 * MiB
    plan = plan_worker_memory(2)
    assert plan.baseline == baseline
    assert plan.limit * plan.pause_fraction - baseline >= WORKING_ROOM_BYTES - 1


def test_explicit_memory_limit_is_validated():
    with pytest.raises(ValueError, match="memory_limit"):
        start_client(2, memory_limit="lots", quiet=True, use_gpu=False)
    with pytest.raises(ValueError, match="memory_limit"):
        start_client(2, memory_limit="1MiB", quiet=True, use_gpu=False)


@pytest.mark.timeout(90)
def test_workers_that_cannot_hold_their_imports_fail_within_seconds():
    t0 = time.monotonic()
    with pytest.raises(WorkerMemoryError, match=r"(?s)160 MiB cannot hold a worker's own imports.*\d+ MiB.*at least"):
        with start_client(2, memory_limit="160MiB", quiet=True, use_gpu=False) as client:
            run_data_parallel(DataParallelConfig(workers=2, steps=3, batch_size=8), client)
    assert time.monotonic() - t0 < 45


def _pause(dask_worker) -> None:  # noqa: ANN001 - runs on the worker through client.run
    """Make dask's own memory monitor pause this worker: a pause threshold below what it already holds."""
    dask_worker.memory_manager.memory_pause_fraction = 0.01


def _wait_paused(client, address: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while memory.scheduler_workers(client)[address]["status"] != "paused":
        assert time.monotonic() < deadline, "the worker was never paused"
        time.sleep(0.1)


def _pause_every_worker(client) -> list[str]:
    """Pause every worker through dask's memory monitor (what the CUDA wheel did at the old limit); addresses."""
    addresses = worker_addresses(client)
    client.run(_pause)
    for address in addresses:
        _wait_paused(client, address)
    return addresses


@pytest.mark.timeout(120)
def test_a_run_on_paused_workers_fails_within_seconds_naming_memory(fresh_client):
    """What the CUDA wheel did to the old 768 MiB limit: every worker paused at idle, and runs waited."""
    addresses = _pause_every_worker(fresh_client)
    t0 = time.monotonic()
    with pytest.raises(WorkerMemoryError, match=rf"(?s)paused by dask's memory monitor.*{addresses[0]} holds \d+ MiB.*fewer workers"):
        run_data_parallel(DataParallelConfig(workers=2, steps=3, batch_size=8), fresh_client)
    # A paused run would wait out the test's 120 s; the check answers at once (12.4 s once on a machine at load ~30)
    assert time.monotonic() - t0 < 60


def _wait_for_stop(ctx) -> int:  # noqa: ANN001 - a rank function for run_live
    while not ctx.should_stop():
        time.sleep(0.05)
    return ctx.rank


@pytest.mark.timeout(120)
def test_a_rank_queued_on_a_worker_paused_after_the_checks_ends_the_run(fresh_client, monkeypatch):
    """The pause comes after run_live's start checks (switched off here), so its polling loop must notice."""
    monkeypatch.setattr(live, "check_workers_memory", lambda *a, **k: None)
    target = worker_addresses(fresh_client)[1]
    fresh_client.run(_pause, workers=[target])
    _wait_paused(fresh_client, target)
    t0 = time.monotonic()
    outcome: list[BaseException | None] = []

    def go() -> None:
        try:
            live.run_live(fresh_client, _wait_for_stop, [(), ()], TraceRecorder(), timeout_s=60)
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            outcome.append(exc)

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    thread.join(30)
    assert outcome and isinstance(outcome[0], WorkerMemoryError), outcome
    assert "rank(s) [1] cannot start" in str(outcome[0])
    assert time.monotonic() - t0 < 15


@pytest.mark.timeout(120)
def test_the_panel_shows_the_memory_error_where_the_user_looks(fresh_client):
    from dsgd_teach.panel import ExperimentPanel

    _pause_every_worker(fresh_client)
    panel = ExperimentPanel(fresh_client, run_data_parallel, DataParallelConfig(workers=2, steps=3),
                            resize_cluster=False)
    t0 = time.monotonic()
    panel.run_button.click()
    assert panel.wait(60) is None
    assert time.monotonic() - t0 < 15
    assert panel.error.startswith("WorkerMemoryError") and "paused by dask's memory monitor" in panel.error
    assert "fewer workers" in panel.error_box.value
