"""Torch threads per worker are shared out by machine, so emulated hosts on one machine do not oversubscribe it."""

from __future__ import annotations

import subprocess
import sys

from dsgd_teach.runtime.clusters import worker_settings


class _FakeClient:
    """Answers client.run(_machine_cores) with fixed (machine, cores) per worker address."""

    def __init__(self, cores: dict[str, tuple[str, int]]):
        self.cores = cores

    def run(self, fn):  # noqa: ANN001, ANN201 - stands in for distributed.Client.run
        assert fn is worker_settings._machine_cores
        return self.cores


def test_workers_on_emulated_hosts_of_one_machine_share_its_cores():
    client = _FakeClient({f"tcp://10.213.7.{i}:4000{i}": ("boot-a", 8) for i in range(2, 6)})
    assert worker_settings.threads_by_host(client) == {f"10.213.7.{i}": 2 for i in range(2, 6)}


def test_separate_machines_keep_their_own_cores():
    client = _FakeClient({"tcp://10.0.0.1:1": ("boot-a", 8), "tcp://10.0.0.1:2": ("boot-a", 8),
                          "tcp://10.0.0.2:1": ("boot-b", 4)})
    assert worker_settings.threads_by_host(client) == {"10.0.0.1": 4, "10.0.0.2": 4}


def test_this_machine_is_named_by_its_boot_id():
    machine, cores = worker_settings._machine_cores()
    assert machine and cores >= 1


def test_release_free_memory_gives_back_the_holes_freed_tensors_leave():
    """With the workers' thresholds, freed megabyte arrays stay in the heap below a live one (the trim threshold
    only reaches the top); release_free_memory hands those pages back. In a fresh process, so as to measure."""
    code = """
import numpy as np, psutil
from dsgd_teach.machine import WORKER_MALLOC
from dsgd_teach.runtime.clusters.worker_settings import release_free_memory, set_malloc
assert set_malloc(WORKER_MALLOC["MALLOC_MMAP_THRESHOLD_"], WORKER_MALLOC["MALLOC_TRIM_THRESHOLD_"])
arrays = [np.ones(2**18, dtype=np.float32) for _ in range(300)]  # 300 MiB in 1 MiB arrays, from the heap
top = np.ones(2**18, dtype=np.float32)  # above them all: the heap cannot shrink from its top
del arrays
before = psutil.Process().memory_info().rss
assert release_free_memory()
print((before - psutil.Process().memory_info().rss) >> 20)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert int(out.stdout.split()[-1]) >= 200, out.stdout
