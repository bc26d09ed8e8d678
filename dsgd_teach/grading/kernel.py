"""Kernel wrapper used by the grader: set resource limits, fence the process, then run a normal ipykernel.

Usage (written into a private kernelspec by the worker):
    python -m dsgd_teach.grading.kernel MEMORY_MB CPU_S WORKDIR PROTECTED_PATHS_JSON DENIAL_FD -- <ipykernel args>

DENIAL_FD is the write end of the worker's denial channel (-1: report denials on stderr).
"""

from __future__ import annotations

import importlib
import json
import os
import re
import sys
from collections.abc import Iterable

import dsgd_teach

KERNEL_NICE = 15
#: Packages whose import the fence would stop (torch loads native code through ctypes), and those the course declares
#: in its package's GRADING_PREIMPORT (the grader names none of the course's modules itself): a notebook that imports
#: one gets it imported here, before the fence goes up. top-level name in the cells -> module to import.
WARMABLE = {"torch": "torch", **dict(getattr(dsgd_teach, "GRADING_PREIMPORT", {}))}


def warm_for(sources: Iterable[str]) -> str:
    """The WARMABLE names the cells import, comma-separated: the kernel's DSGD_KERNEL_WARM."""
    text = "\n".join(sources)
    return ",".join(n for n in WARMABLE if re.search(rf"^[ \t]*(?:from|import)[ \t]+{re.escape(n)}\b", text, re.M))


def main(argv: list[str]) -> None:
    """Apply limits and the audit hook in this process, then hand over to ipykernel."""
    split = argv.index("--")
    memory_mb, cpu_s, workdir, protected, denial_fd = argv[:split]
    from . import sandbox

    os.chdir(workdir)
    # Warm the modules a kernel needs before the fence goes up (numpy loads native code through ctypes).
    import ipykernel.kernelapp
    import numpy  # noqa: F401

    from . import probe  # noqa: F401
    from .checks import check  # noqa: F401
    for name in os.environ.get("DSGD_KERNEL_WARM", "").split(","):
        if name in WARMABLE:  # only these: the student's cells decide which, never what
            importlib.import_module(WARMABLE[name])

    try:  # past the sandbox's memory limit, the OOM killer ends this kernel (or what it starts), not the worker
        with open("/proc/self/oom_score_adj", "w") as fh:
            fh.write("1000")
    except OSError:
        pass
    # Within its sandbox's CPU share the worker comes first: 60 spinning children at nice 15 (weight 36 each)
    # still leave the worker a third of it, enough to stop the notebook at its budget and send its result.
    if os.nice(0) < KERNEL_NICE:
        os.nice(KERNEL_NICE - os.nice(0))
    roots = sandbox.default_read_roots()
    sandbox.set_limits(int(memory_mb), int(cpu_s))
    sandbox.install(workdir, roots, json.loads(protected), int(denial_fd))
    ipykernel.kernelapp.launch_new_instance(argv=argv[split + 1:])


if __name__ == "__main__":
    main(sys.argv[1:])
