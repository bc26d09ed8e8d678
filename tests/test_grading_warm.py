"""The grading kernel imports torch and the course's runtime before its audit fence, and only when the cells do."""

from __future__ import annotations

import subprocess
import sys

from dsgd_teach.grading.kernel import WARMABLE, warm_for


def test_the_cells_decide_which_allowed_packages_are_imported_early() -> None:
    cells = ["import numpy as np\nimport torch\n", "from dsgd_teach.runtime.ranks.comm import Comm\n", "x = 1"]
    assert warm_for(cells) == "torch,dsgd_teach.runtime"
    assert warm_for(["import numpy as np", "# import torch", "s = 'from dsgd_teach.runtime import x'"]) == ""
    assert warm_for(["import torchvision"]) == ""  # a longer name is not torch


def test_every_warmable_module_imports_without_starting_a_cluster() -> None:
    code = (f"import sys, importlib\nfor m in {sorted(WARMABLE.values())!r}:\n    importlib.import_module(m)\n"
            "print(sorted(m for m in ('distributed', 'pandas', 'dask') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout  # the fence's neighbours stay out: nothing reads /proc early
