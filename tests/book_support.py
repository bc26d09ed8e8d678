"""Where this test run keeps the chapters it executed, so the book test reuses them instead of running them again."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

RUNS = Path(__file__).resolve().parent.parent / "build" / "test-executed"


def executed_dir() -> Path:
    """This run's folder of executed chapters: shared by pytest-xdist's workers (one test-run id), else by the
    tests of this one process. Folders of runs older than a day are removed."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"pid{os.getpid()}"
    RUNS.mkdir(parents=True, exist_ok=True)
    for old in RUNS.iterdir():
        if old.name != run and old.stat().st_mtime < time.time() - 86400:
            shutil.rmtree(old, ignore_errors=True)
    out = RUNS / run
    out.mkdir(exist_ok=True)
    return out
