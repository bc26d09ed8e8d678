"""The naive schedule: one microbatch in flight, so only one stage is ever busy.

Every stage runs forward(k) then backward(k) for k = 0, 1, ...; stage s cannot start forward(k+1) before the
gradient of microbatch k has come all the way back, which is the backward locking Huo et al. (2018) describe:
with p stages each stage idles (p-1)/p of the time.
"""

from __future__ import annotations

Action = tuple[str, int]  # ("F" or "B", microbatch id)


def schedule(stages: int, microbatches: int, stage: int) -> list[Action]:
    """Stage `stage`'s actions for one step: F0 B0 F1 B1 ... (the same on every stage)."""
    out: list[Action] = []
    for k in range(microbatches):
        out += [("F", k), ("B", k)]
    return out
