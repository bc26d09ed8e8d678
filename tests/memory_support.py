"""Binder budget: a chapter, run top to bottom with its default (full-mode) settings, stays within 2 GiB.

Memory is the sum of the proportional set size (PSS) of the kernel and all its descendants (dask nannies' worker
processes, helpers), sampled every 0.2 s. PSS charges a shared page (torch and numpy libraries mapped by every
process, shared-memory blocks) once in total, split between the processes that map it, so the sum is what the
machine actually holds for the course; RSS would count those pages once per process (its sum is reported too).

Reading a process's PSS makes the kernel walk its page tables (about 12 ms for a process that imported torch), so
the sampler reads the cheap RSS every 0.2 s and PSS only when it could matter: PSS <= RSS for every process, so
while the RSS sum stays at or below the PSS peak already seen, no new peak is possible. Otherwise (a new RSS high,
or above that bound) it reads PSS, and at least once a second in any case.

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
from dsgd_teach.runtime.cluster import MEMORY_BUDGET_BYTES

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
