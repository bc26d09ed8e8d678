"""One wall-clock budget per notebook, whatever its number of cells; denial flags no output flood can erase."""

from __future__ import annotations

import time

import pytest

from dsgd_teach.grading import bubblewrap
from dsgd_teach.grading.batch import Limits, run_worker

needs_sandbox = pytest.mark.skipif(bool(bubblewrap.probe()), reason=f"no OS sandbox here: {bubblewrap.probe()}")
TEST = {"source": 'check("one", 1, 1)', "grade_id": "q"}


@needs_sandbox
def test_many_short_cells_share_one_notebook_budget():
    cells = [{"source": "import time"}] + [{"source": "time.sleep(1)"}] * 40 + [TEST]
    limits = Limits(timeout_s=5, memory_mb=1536, cpu_s=60, notebook_s=12)
    start = time.monotonic()
    result = run_worker(cells, "student", limits, 1, [])
    took = time.monotonic() - start
    assert result["tests"]["q"]["status"] == "not run", result
    assert "time budget of 12 s ran out" in result["tests"]["q"]["error"] and result["stopped"], result
    assert took < 12 + 25, f"the notebook ran {took:.0f} s"


@needs_sandbox
def test_a_denial_stays_flagged_whatever_the_kernel_prints_after_it():
    cells = [{"source": "import subprocess, sys\ntry:\n    subprocess.run(['/bin/true'])\nexcept PermissionError:\n"
                        "    pass\nsys.stderr.write('w' * 300_000)\nsys.stderr.flush()\nprint('y' * 300_000)"},
             {"source": "import os\nos.write(2, b'z' * 300_000)"}, TEST]
    result = run_worker(cells, "student", Limits(timeout_s=30, cpu_s=60), 1, [])
    assert result["tests"]["q"]["records"] and any("subprocess.Popen" in f for f in result["flags"]), result
    honest = run_worker([{"source": "import numpy as np\nx = np.ones(3)"}, TEST], "student",
                        Limits(timeout_s=30, cpu_s=60), 1, [])
    assert honest["flags"] == [] and honest["tests"]["q"]["status"] == "ok", honest
