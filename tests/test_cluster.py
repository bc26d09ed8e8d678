"""Cluster lifecycle: start, resize, close leaves nothing behind; external schedulers; GPU fallback."""

from __future__ import annotations

import socket
import time

import psutil
import pytest
import torch
from conftest import _children
from distributed import LocalCluster

from dsgd_teach.runtime.clusters.cluster import (
    MIN_GPU_WORKER_MEMORY_BYTES,
    ClusterInfo,
    _gpu_cluster,
    start_client,
    threads_per_worker_process,
    worker_addresses,
    worker_memory_limit,
)


def _worker_pids() -> set[int]:
    """Live child processes other than multiprocessing's helpers (a worker that exited a moment ago, a zombie not
    yet reaped, is not one)."""
    return {p.pid for p in _children()}


def _port_free(address: str) -> bool:
    """True when nothing listens on the address's port any more (and it can be bound again)."""
    host, port = address.rsplit("/", 1)[-1].rsplit(":", 1)
    listening = any(
        c.laddr and c.laddr.port == int(port) and c.status == psutil.CONN_LISTEN
        for c in psutil.net_connections(kind="tcp")
    )
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, int(port)))
        except OSError:
            return False
    return not listening


@pytest.mark.timeout(180)
def test_start_resize_close_leaves_no_child_process():
    before = _worker_pids()
    client = start_client(2, quiet=True, use_gpu=False)
    try:
        assert client.info.kind == "local"
        addresses = worker_addresses(client)
        assert len(addresses) == 2 and all(a.startswith("tcp://127.0.0.1:") for a in addresses)
        assert client.dashboard_link.startswith("http://127.0.0.1:")
        assert set(client.run(torch.get_num_threads).values()) == {threads_per_worker_process(2)}
        message = client.resize(3)
        assert client.n_workers() == 3
        if psutil.cpu_count() < 3:
            assert "time-slices" in message
        assert set(client.run(torch.get_num_threads).values()) == {threads_per_worker_process(3)}
        client.resize(1)
        assert client.n_workers() == 1
        assert set(client.run(torch.get_num_threads).values()) == {threads_per_worker_process(1)}
        assert len(_worker_pids() - before) >= 1
        scheduler_address = client.scheduler.address
    finally:
        client.close()
    deadline = time.monotonic() + 15
    while _worker_pids() - before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _worker_pids() - before, "worker processes survived close()"
    assert _port_free(scheduler_address), "the scheduler port is still bound after close()"


def test_threads_and_memory_rules():
    assert threads_per_worker_process(2, cores=2) == 1
    assert threads_per_worker_process(1, cores=8) == 8
    assert threads_per_worker_process(3, cores=8) == 2
    assert threads_per_worker_process(16, cores=2) == 1
    # a worker that sees a GPU held 1117 MiB with CUDA, cuBLAS and NCCL up (H100): the Binder budget is too small
    assert worker_memory_limit(2, gpu=True) >= MIN_GPU_WORKER_MEMORY_BYTES >= 2 * 1117 * 1024**2
    with pytest.raises(ValueError, match="n_workers"):
        start_client(0, quiet=True)


@pytest.mark.parametrize(
    ("n_workers", "gpus", "asked", "reason"),
    [
        (None, 0, False, "no GPU visible"),
        (None, 1, False, "1 GPU(s) visible, fewer than the 2 workers wanted"),  # chapters need two workers
        (2, 1, True, "1 GPU(s) visible, fewer than the 2 workers wanted"),
        (3, 2, False, "2 GPU(s) visible, fewer than the 3 workers wanted"),
    ],
)
def test_gpu_cluster_only_when_every_worker_gets_a_gpu(n_workers, gpus, asked, reason):
    """Pure policy, no GPU needed: too few GPUs means CPU worker processes, and the note says why."""
    cluster, note = _gpu_cluster(n_workers, gpus, asked)
    assert cluster is None and reason in note


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the path where dask-cuda is missing")
def test_enough_gpus_without_dask_cuda_names_the_extra(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "dask_cuda", None)  # import fails, as when the [gpu] extra is not installed
    cluster, note = _gpu_cluster(None, 2, asked=False)
    assert cluster is None and "dask-cuda is not installed" in note and "[gpu]" in note


@pytest.mark.timeout(120)
def test_a_gpu_cluster_refuses_to_grow_past_its_gpus(fresh_client):
    """resize() on a one-worker-per-GPU cluster beyond its GPUs says what to do instead of failing inside dask."""
    real = fresh_client.info
    fresh_client.info = ClusterInfo("cuda", "a GPU cluster (kind faked; this cluster has no GPUs)", None)
    try:
        with pytest.raises(RuntimeError, match="one worker per GPU and has 0 GPU.*use_gpu=False"):
            fresh_client.resize(3)
    finally:
        fresh_client.info = real
    assert fresh_client.n_workers() == 2


@pytest.mark.timeout(120)
def test_resize_rejects_bad_counts(client):
    with pytest.raises(ValueError, match="n_workers"):
        client.resize(0)


@pytest.mark.timeout(120)
def test_existing_scheduler_is_used_and_left_running(monkeypatch):
    with LocalCluster(n_workers=1, threads_per_worker=1, host="127.0.0.1", dashboard_address=":0") as cluster:
        monkeypatch.setenv("DSGD_SCHEDULER", cluster.scheduler_address)
        client = start_client(quiet=True)
        try:
            assert client.info.kind == "external"
            assert client.submit(sum, [2, 3]).result(timeout=30) == 5
            with pytest.raises(RuntimeError, match="external scheduler"):
                client.resize(2)
        finally:
            client.close()
        assert cluster.status.name == "running"
        assert len(cluster.scheduler_info["workers"]) == 1


@pytest.mark.timeout(120)
def test_gpu_request_without_gpu_falls_back_with_a_reason(capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present; the fallback path is not taken")
    with start_client(1, use_gpu=True) as client:
        assert client.info.kind == "local"
        assert "no GPU visible" in client.info.note
    assert "no GPU visible" in capsys.readouterr().out


@pytest.mark.gpu
@pytest.mark.timeout(180)
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_cluster_runs_on_cuda():
    pytest.importorskip("dask_cuda")
    with start_client(quiet=True, use_gpu=True) as client:
        assert client.info.kind == "cuda"
        assert all(client.run(torch.cuda.is_available).values())


@pytest.mark.timeout(120)
def test_owned_cluster_workers_run_quiet(client):
    """The settings that keep an idle course cluster off the cores reach every worker process."""

    def settings() -> tuple:
        import os

        import dask

        return (
            dask.config.get("distributed.worker.profile.enabled"),
            dask.config.get("distributed.admin.tick.interval"),
            os.environ.get("MALLOC_MMAP_THRESHOLD_"),
        )

    seen = client.run(settings)
    assert seen and all(v == (False, "1s", str(16 * 2**20)) for v in seen.values()), seen
