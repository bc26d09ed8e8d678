"""A grading kernel is shut down as soon as its cells have run, before the worker reads its denial channel."""

from __future__ import annotations

import contextlib

import psutil

from dsgd_teach.grading import denials, worker


def test_the_kernel_is_gone_before_the_denials_are_read(monkeypatch) -> None:
    alive_at_read: list[list[str]] = []
    read = denials.Denials.flags

    def flags(self: denials.Denials) -> list[str]:
        kernels = []
        for proc in psutil.Process().children(recursive=True):  # this process may have other children (clusters)
            with contextlib.suppress(psutil.Error):
                if proc.status() != psutil.STATUS_ZOMBIE and "dsgd_teach.grading.kernel" in " ".join(proc.cmdline()):
                    kernels.append(proc.pid)
        alive_at_read.append(kernels)
        return read(self)

    monkeypatch.setattr(denials.Denials, "flags", flags)
    job = {"cells": [{"source": "x = 1"}], "timeout": 60, "memory_mb": 1536, "cpu_s": 120, "seed": 3,
           "protected": [], "budget_s": 300}
    result = worker.run_job(job)
    assert result["cell_errors"] == [] and result["flags"] == [], result
    # A kernel left running holds the channel's write end: reading it would wait out its join timeout every run.
    assert alive_at_read == [[]], alive_at_read
