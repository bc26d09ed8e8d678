"""1F1B (PipeDream-Flush; Narayanan et al., 2019/2021): same bubble and result as GPipe, far less memory.

Stage s first runs w = min(p-1-s, m) forwards to fill the pipeline (warm-up), then alternates one forward with
one backward (steady state), then runs the remaining backwards (cool-down). A microbatch's activations are freed
by its backward, so stage s never holds more than w+1 <= p of them, whatever m is.
"""

from __future__ import annotations

from .actions import Action, StageOps


def warmup(stages: int, microbatches: int, stage: int) -> int:
    """Forwards stage `stage` runs before its first backward (the last stage: none)."""
    return min(stages - 1 - stage, microbatches)


def train_step(stage: StageOps, stages: int, microbatches: int, rank: int) -> None:
    """One step on one stage: warm-up forwards, then one forward and one backward at a time, then cool-down."""
    w = warmup(stages, microbatches, rank)
    for k in range(w):  # warm-up: fill the pipeline below this stage
        x = stage.receive_activation(k)
        out = stage.forward(k, x)
        stage.send_activation(k, out)
    for i in range(microbatches - w):  # steady state: forward of microbatch w+i, backward of microbatch i
        x = stage.receive_activation(w + i)
        out = stage.forward(w + i, x)
        stage.send_activation(w + i, out)
        grad = stage.receive_gradient(i)
        grad_in = stage.backward(i, grad)
        stage.send_gradient(i, grad_in)
    for k in range(microbatches - w, microbatches):  # cool-down: the backwards still owed
        grad = stage.receive_gradient(k)
        grad_in = stage.backward(k, grad)
        stage.send_gradient(k, grad_in)


def schedule(stages: int, microbatches: int, stage: int) -> list[Action]:
    """Warm-up forwards, then F(w+i) B(i) pairs, then the last w backwards, in microbatch order."""
    w = warmup(stages, microbatches, stage)
    out: list[Action] = [("F", k) for k in range(w)]
    for i in range(microbatches - w):
        out += [("F", w + i), ("B", i)]
    out += [("B", k) for k in range(microbatches - w, microbatches)]
    return out
