"""1F1B (PipeDream-Flush; Narayanan et al., 2019/2021): same bubble and result as GPipe, far less memory.

Stage s first runs w = min(p-1-s, m) forwards to fill the pipeline (warm-up), then alternates one forward with
one backward (steady state), then runs the remaining backwards (cool-down). A microbatch's activations are freed
by its backward, so stage s never holds more than w+1 <= p of them, whatever m is.
"""

from __future__ import annotations

Action = tuple[str, int]  # ("F" or "B", microbatch id)


def warmup(stages: int, microbatches: int, stage: int) -> int:
    """Forwards stage `stage` runs before its first backward (the last stage: none)."""
    return min(stages - 1 - stage, microbatches)


def schedule(stages: int, microbatches: int, stage: int) -> list[Action]:
    """Warm-up forwards, then F(w+i) B(i) pairs, then the last w backwards, in microbatch order."""
    w = warmup(stages, microbatches, stage)
    out: list[Action] = [("F", k) for k in range(w)]
    for i in range(microbatches - w):
        out += [("F", w + i), ("B", i)]
    out += [("B", k) for k in range(microbatches - w, microbatches)]
    return out
