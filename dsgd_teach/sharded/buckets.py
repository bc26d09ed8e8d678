"""Gradient buckets as DDP forms them: parameters in reverse registration order, cut when a bucket passes a cap.

Backward produces gradients roughly from the last layer to the first, so filling buckets in reverse order lets
the first bucket be ready, and its allreduce start, while backward is still computing the earlier layers
(Li et al. 2020, section 3.2.3).
"""

from __future__ import annotations

from collections.abc import Sequence


def assign_buckets(sizes_bytes: Sequence[int], cap_bytes: int) -> list[list[int]]:
    """Indices of the parameters in each bucket: reverse order, a new bucket once the current one reaches cap_bytes.

    A parameter is never split: one larger than the cap joins the open bucket and closes it (alone only when that
    bucket was empty). cap_bytes <= 0 means one bucket per parameter.
    """
    buckets: list[list[int]] = []
    current: list[int] = []
    filled = 0
    for i in reversed(range(len(sizes_bytes))):
        current.append(i)
        filled += sizes_bytes[i]
        if filled >= cap_bytes:
            buckets.append(current)
            current, filled = [], 0
    if current:
        buckets.append(current)
    return buckets


def bucket_bytes(sizes_bytes: Sequence[int], buckets: list[list[int]]) -> list[int]:
    """Bytes of each bucket."""
    return [sum(sizes_bytes[i] for i in b) for b in buckets]
