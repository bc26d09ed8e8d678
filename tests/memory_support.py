"""Binder budget: a chapter, run top to bottom with its default (full-mode) settings, stays within 2 GiB.

Memory is the sum of the proportional set size (PSS) of the kernel and all its descendants (dask nannies' worker
processes, helpers), sampled every 0.2 s. PSS charges a shared page (torch and numpy libraries mapped by every
process, shared-memory blocks) once in total, split between the processes that map it, so the sum is what the
machine actually holds for the course; RSS would count those pages once per process (its sum is reported too).

Reading a process's PSS makes the kernel walk its page tables (about 12 ms for a process that imported torch, and
~185 ms for a chapter's kernel and workers together), so the sampler reads the cheap RSS every 0.2 s and PSS only
when it could matter. Since the last PSS read, the tree's PSS can have grown by at most what its RSS grew (new pages
count fully in both), so while that bound stays within STEP_BYTES of the peak already seen no read is made; PSS is
also read every so often in any case (pages shared with processes outside the tree, or copied on write, raise PSS
with no new RSS), at most 5 % of one core's time: a chapter's peak is read to within STEP_BYTES.

tests/test_browser.py samples each chapter's kernel this way while JupyterLab runs it in full mode;
tests/test_memory.py checks that the sampler sees what it should.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time

import psutil

from dsgd_teach.course_runner import COURSE_DIR
from dsgd_teach.memory import ESTIMATED_BASELINE_BYTES, torch_build, worker_baseline
from dsgd_teach.runtime.clusters.cluster import MEMORY_BUDGET_BYTES

REPORT = COURSE_DIR.parent / "build" / "memory" / "peaks.json"
MiB = 1024**2
#: How close to a chapter's true PSS peak the sampler reads it (a read is made whenever RSS could have taken PSS
#: this far past the peak seen).
STEP_BYTES = 16 * MiB
#: The most of one core's time the sampler's PSS reads take.
MAX_CPU_SHARE = 0.05


class TreeMemory(threading.Thread):
    """Samples PSS and RSS summed over a process and its descendants until stopped; keeps the peaks."""

    def __init__(self, pid: int, interval_s: float = 0.2, pss_every_s: float = 2.0) -> None:
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
        last_read, last_pss, last_rss, read_cost = float("-inf"), 0, 0, 0.0
        while not self._halt.is_set():
            rss, n = self.rss()
            now = time.monotonic()
            bound = last_pss + max(0, rss - last_rss)  # the most PSS can be now, short of pages shared anew
            due = now - last_read >= max(self.pss_every_s, read_cost / MAX_CPU_SHARE)
            if bound > self.peak_pss + STEP_BYTES or due:
                cpu = time.thread_time()
                last_pss, last_rss, n = self.sample()
                read_cost, last_read = time.thread_time() - cpu, now
                self.peak_pss = max(self.peak_pss, last_pss)
                self.pss_samples += 1
            self.peak_rss, self.peak_procs = max(self.peak_rss, rss), max(self.peak_procs, n)
            self.samples += 1
            self._halt.wait(self.interval_s)

    def stop(self) -> None:
        self._halt.set()
        self.join(10)


def record_peak(stem: str, entry: dict) -> None:
    """Add a chapter's peaks to build/memory/peaks.json (one entry per chapter, the latest run's)."""
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    data = json.loads(REPORT.read_text()) if REPORT.exists() else {}
    data[stem] = entry
    REPORT.write_text(json.dumps(data, indent=1))


def budget_for_build(processes: int) -> int:
    """Binder's 2 GiB with the CPU build Binder installs; PyPI's CUDA build adds its measured extra imports
    (about 400 MiB of CUDA libraries that no other process shares) to each of the processes."""
    if torch_build() == "cpu":
        return MEMORY_BUDGET_BYTES
    return MEMORY_BUDGET_BYTES + processes * max(0, worker_baseline() - ESTIMATED_BASELINE_BYTES["cpu"])
