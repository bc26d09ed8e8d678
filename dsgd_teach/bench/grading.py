"""Grading throughput: a batch of ps01 submissions (correct, stubs, wrong) graded in isolated kernels."""

from __future__ import annotations

from ..grading.bench import measure as _measure_batch


def measure() -> dict[str, float]:
    """Seconds to grade 10 submissions of ps01 on one job (the 30-submission figure: python -m dsgd_teach.grading.bench 30)."""
    return _measure_batch(n=10, assignment="ps01_sgd", jobs=1)
