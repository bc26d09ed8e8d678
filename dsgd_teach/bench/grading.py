"""Grading throughput: ps01 submissions (correct, stubs, wrong) graded in bubblewrap sandboxes and without one."""

from __future__ import annotations

from ..grading.bench import measure as _measure_batch

ROUNDS = 2
PER_BATCH = 6


def measure() -> dict[str, float]:
    """Seconds per notebook with the OS sandbox and with --unsafe-no-sandbox, alternating batches in one run.

    `sandbox_overhead_ratio` (sandboxed / unsandboxed time per notebook) is the figure to quote; the goal is <= 1.2.
    The 30-submission figure: python -m dsgd_teach.grading.bench 30.
    """
    walls = {True: 0.0, False: 0.0}
    full = {True: 0.0, False: 0.0}
    for _ in range(ROUNDS):
        for sandbox in (False, True):
            figures = _measure_batch(n=PER_BATCH, assignment="ps01_sgd", jobs=1, sandbox=sandbox)
            walls[sandbox] += figures["grade_batch_s"]
            full[sandbox] += figures["full_marks"]
    notebooks = ROUNDS * (PER_BATCH + 1)  # each batch also runs the reference notebook
    per_sandbox, per_unsafe = walls[True] / notebooks, walls[False] / notebooks
    return {"submissions": float(ROUNDS * PER_BATCH), "per_notebook_s_sandbox": round(per_sandbox, 2),
            "per_notebook_s_unsafe": round(per_unsafe, 2),
            "sandbox_overhead_ratio": round(per_sandbox / per_unsafe, 3),
            "full_marks_sandbox": full[True], "full_marks_unsafe": full[False]}
