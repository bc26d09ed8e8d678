"""The memory sampler that holds every chapter to Binder's 2 GiB (tests/memory_support.py) is not blind: it sees a
child's memory and a peak that comes and goes between its costly reads. The chapters themselves are measured while
JupyterLab runs them in full mode (tests/test_browser.py)."""

from __future__ import annotations

import time

from memory_support import STEP_BYTES, MiB, TreeMemory


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
    """The sampling loop (cheap RSS, PSS when it could be a new peak) records a child's short-lived 300 MiB (to within
    STEP_BYTES: a read is skipped while RSS could not have taken PSS that far past the peak seen)."""
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
        assert sampler.peak_pss >= 300 * MiB - STEP_BYTES, sampler.peak_pss / MiB  # read to within STEP_BYTES
        assert sampler.pss_samples < sampler.samples  # the costly read was skipped when it could not matter
    finally:
        child.kill()
        child.wait(10)


def test_the_sampler_reads_pss_seldom_while_memory_holds_still():
    """A steady tree costs a PSS read each 2 s at most (each read walks page tables: ~185 ms for a chapter's tree),
    not one at every new RSS high or every second."""
    import subprocess
    import sys

    code = "import sys, time; b = bytearray(100 * 2**20); sys.stdout.write('ok\\n'); sys.stdout.flush(); time.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline().strip() == b"ok"
        sampler = TreeMemory(child.pid)
        t0 = time.monotonic()
        sampler.start()
        time.sleep(5)
        sampler.stop()
        allowed = 1 + (time.monotonic() - t0) / 2.0  # one read each 2 s at most
        assert sampler.peak_pss >= 100 * MiB
        assert sampler.pss_samples <= allowed, (sampler.pss_samples, sampler.samples)
    finally:
        child.kill()
        child.wait(10)
