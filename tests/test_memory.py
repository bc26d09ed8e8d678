"""Binder budget: each chapter, run top to bottom with its default (full-mode) settings, stays within 2 GiB.

Memory is the sum of the proportional set size (PSS) of the kernel and all its descendants (dask nannies' worker
processes, helpers), sampled every 0.2 s. PSS charges a shared page (torch and numpy libraries mapped by every
process, shared-memory blocks) once in total, split between the processes that map it, so the sum is what the
machine actually holds for the course; RSS would count those pages once per process (its sum is reported too).

Reading a process's PSS makes the kernel walk its page tables (about 12 ms for a process that imported torch), so
the sampler reads the cheap RSS every 0.2 s and PSS only when it could matter: PSS <= RSS for every process, so
while the RSS sum stays at or below the PSS peak already seen, no new peak is possible. Otherwise (a new RSS high,
or above that bound) it reads PSS, and at least once a second in any case.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import nbformat
import psutil
import pytest
from book_support import executed_dir
from nbclient import NotebookClient

from dsgd_teach.course_runner import COURSE_DIR, chapters, record_run, write_executed
from dsgd_teach.memory import ESTIMATED_BASELINE_BYTES, torch_build, worker_baseline
from dsgd_teach.panel import SNAPSHOT_ENV
from dsgd_teach.runtime.cluster import MEMORY_BUDGET_BYTES

CHAPTERS = chapters()
REPORT = COURSE_DIR.parent / "build" / "memory" / "peaks.json"
MiB = 1024**2


class TreeMemory(threading.Thread):
    """Samples PSS and RSS summed over a process and its descendants until stopped; keeps the peaks."""

    def __init__(self, pid: int, interval_s: float = 0.2, pss_every_s: float = 1.0) -> None:
        super().__init__(name="memory-sampler", daemon=True)
        self.root = psutil.Process(pid)
        self.interval_s, self.pss_every_s = interval_s, pss_every_s
        self.peak_pss = self.peak_rss = self.samples = self.peak_procs = self.pss_samples = 0
        self._halt = threading.Event()

    def _tree(self) -> list[psutil.Process]:
        try:
            return [self.root, *self.root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def rss(self) -> tuple[int, int]:
        """(RSS sum, process count) for the tree right now: cheap (one small /proc read per process)."""
        rss = n = 0
        for proc in self._tree():
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                rss, n = rss + proc.memory_info().rss, n + 1
        return rss, n

    def sample(self) -> tuple[int, int, int]:
        """(PSS sum, RSS sum, process count) for the tree right now; processes that vanish are skipped."""
        pss = rss = n = 0
        for proc in self._tree():
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                info = proc.memory_full_info()
                pss, rss, n = pss + info.pss, rss + info.rss, n + 1
        return pss, rss, n

    def run(self) -> None:
        last_pss = float("-inf")
        while not self._halt.is_set():
            rss, n = self.rss()
            now = time.monotonic()
            # PSS <= RSS: at or below the PSS peak, the tree cannot be at a new PSS peak; skip the costly read
            if rss > self.peak_pss and (rss > self.peak_rss or now - last_pss >= self.pss_every_s):
                pss, rss, n = self.sample()
                self.peak_pss, last_pss = max(self.peak_pss, pss), now
                self.pss_samples += 1
            self.peak_rss, self.peak_procs = max(self.peak_rss, rss), max(self.peak_procs, n)
            self.samples += 1
            self._halt.wait(self.interval_s)

    def stop(self) -> None:
        self._halt.set()
        self.join(10)


def _record(stem: str, entry: dict) -> None:
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    data = json.loads(REPORT.read_text()) if REPORT.exists() else {}
    data[stem] = entry
    REPORT.write_text(json.dumps(data, indent=1))


def test_sampler_sees_a_child_process_memory():
    """The sampler is not blind: a child holding 200 MiB of touched memory raises the measured peak."""
    import subprocess
    import sys

    code = "import sys, time; b = bytearray(200 * 2**20); sys.stdout.write('ok\\n'); sys.stdout.flush(); time.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline().strip() == b"ok"
        sampler = TreeMemory(child.pid)
        pss, rss, n = sampler.sample()
        assert n == 1 and pss >= 200 * MiB and rss >= pss
        rss_now, n_now = sampler.rss()
        assert n_now == 1 and rss_now >= 200 * MiB
    finally:
        child.kill()
        child.wait(10)


def test_the_running_sampler_catches_a_peak_that_comes_and_goes():
    """The sampling loop (cheap RSS, PSS when it could be a new peak) records a child's short-lived 300 MiB."""
    import subprocess
    import sys

    code = ("import sys, time; sys.stdout.write('ok\\n'); sys.stdout.flush(); time.sleep(1.5)\n"
            "b = bytearray(300 * 2**20); time.sleep(1.5); del b; time.sleep(30)")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline().strip() == b"ok"
        sampler = TreeMemory(child.pid)
        sampler.start()
        time.sleep(5)
        sampler.stop()
        assert sampler.peak_pss >= 300 * MiB, sampler.peak_pss / MiB
        assert sampler.pss_samples < sampler.samples  # the costly read was skipped when it could not matter
    finally:
        child.kill()
        child.wait(10)


@pytest.mark.notebook
@pytest.mark.timeout(900)
@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_fits_in_binder_memory(path: Path, monkeypatch):
    monkeypatch.delenv("DSGD_SMOKE", raising=False)  # the kernel inherits this environment: full mode
    # Binder gives no root, so chapter 05's emulated hosts (network namespaces) are never made there: measure what
    # Binder runs. Where they can be made, they add five processes that import torch (about 900 MiB more).
    monkeypatch.setenv("DSGD_SHAPED_HOSTS", "0")
    # Widget panels run once and leave a static figure, as under `make course` (a learner pressing Run on Binder);
    # tests/test_book.py builds the book from this run's executed chapter instead of executing it again.
    monkeypatch.setenv(SNAPSHOT_ENV, "1")
    nb = nbformat.read(path, as_version=4)
    samplers: list[TreeMemory] = []

    def start_sampling(**_: object) -> None:
        sampler = TreeMemory(client.km.provisioner.pid)
        sampler.start()
        samplers.append(sampler)

    client = NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}},
        on_notebook_start=start_sampling,
    )  # fmt: skip
    t0 = time.perf_counter()
    try:
        client.execute()
    finally:
        for sampler in samplers:
            sampler.stop()
    seconds = time.perf_counter() - t0
    assert samplers and samplers[0].samples > 0, "the memory sampler never ran"
    sampler = samplers[0]
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors, f"{path.name} failed in full mode: {errors[0].ename}: {errors[0].evalue}"
    record_run(nb, datetime.now(timezone.utc) - timedelta(seconds=seconds), seconds)
    write_executed(nb, executed_dir() / path.name)
    entry = {
        "peak_pss_mib": round(sampler.peak_pss / MiB),
        "peak_rss_sum_mib": round(sampler.peak_rss / MiB),
        "max_processes": sampler.peak_procs,
        "samples": sampler.samples,
        "seconds": round(seconds, 1),
    }
    _record(path.stem, entry)
    print(f"{path.stem}: {entry}")
    budget = budget_for_build(sampler.peak_procs)
    assert sampler.peak_pss <= budget, (
        f"{path.name}: kernel + cluster peaked at {sampler.peak_pss / MiB:.0f} MiB PSS "
        f"(RSS sum {sampler.peak_rss / MiB:.0f} MiB), over the {budget / MiB:.0f} MiB budget ({torch_build()} build)"
    )


def budget_for_build(processes: int) -> int:
    """Binder's 2 GiB with the CPU build Binder installs; PyPI's CUDA build adds its measured extra imports
    (about 400 MiB of CUDA libraries that no other process shares) to each of the processes."""
    if torch_build() == "cpu":
        return MEMORY_BUDGET_BYTES
    return MEMORY_BUDGET_BYTES + processes * max(0, worker_baseline() - ESTIMATED_BASELINE_BYTES["cpu"])
