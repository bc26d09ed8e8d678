"""The schedules' tables by name, and what can be said about any of them without running it.

A table lists a stage's actions in order; the plots and the simulator read it, and tests/test_pipeline_loops.py
checks that each schedule's loop (naive.train_step, gpipe.train_step, one_f_one_b.train_step) performs exactly it.
"""

from __future__ import annotations

from collections.abc import Callable

from . import gpipe, naive, one_f_one_b

Action = tuple[str, int]

SCHEDULES: dict[str, Callable[[int, int, int], list[Action]]] = {
    "naive": naive.schedule,
    "gpipe": gpipe.schedule,
    "1f1b": one_f_one_b.schedule,
}


def peak_held(actions: list[Action]) -> int:
    """Most microbatches whose activations a stage holds at once (a forward adds one, a backward frees one)."""
    held = peak = 0
    for kind, _ in actions:
        held += 1 if kind == "F" else -1
        peak = max(peak, held)
    return peak


def ideal_bubble(stages: int, microbatches: int, schedule: str = "gpipe", backward_over_forward: float = 2.0) -> float:
    """Idle fraction of each stage when all stages take equal time and messages are free.

    Decoupled backprop keeps only the forward fill, (p-1) forwards per stage, against a step of (m+p-1)
    forwards and m backwards, so its bubble depends on how long a backward takes against a forward.
    """
    if schedule == "naive":
        return (stages - 1) / stages
    if schedule == "decoupled":
        return (stages - 1) / (microbatches + stages - 1 + microbatches * backward_over_forward)
    return (stages - 1) / (microbatches + stages - 1)
