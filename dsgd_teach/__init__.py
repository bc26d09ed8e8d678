"""dsgd-teach: parallel and distributed SGD, taught by running it on a live dask cluster."""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# Lazy exports: `import dsgd_teach` stays cheap (grading kernels and worker processes import sub-modules only).
_EXPORTS = {
    "start_client": "dsgd_teach.runtime.clusters.cluster",
    "sized": "dsgd_teach.config",
    "smoke_mode": "dsgd_teach.config",
    "Result": "dsgd_teach.trace",
    "StopRequested": "dsgd_teach.trace",
}
__all__ = ["Result", "StopRequested", "__version__", "sized", "smoke_mode", "start_client"]

#: Modules a grading kernel imports before its fence goes up when the cells import them (dsgd_teach/grading/kernel.py
#: reads this; the grader names none of the course's modules itself): the runtime imports torch.distributed, which
#: the fence would stop. Top-level name in the cells -> module to import.
GRADING_PREIMPORT = {"dsgd_teach.runtime": "dsgd_teach.runtime.ranks.thread_group"}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'dsgd_teach' has no attribute {name!r}")
