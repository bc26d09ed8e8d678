"""The naive schedule: one microbatch in flight, so only one stage is ever busy.

Every stage runs forward(k) then backward(k) for k = 0, 1, ...; stage s cannot start forward(k+1) before the
gradient of microbatch k has come all the way back, which is the backward locking Huo et al. (2018) describe:
with p stages each stage idles (p-1)/p of the time.
"""

from __future__ import annotations

from .actions import Action, StageOps


def train_step(stage: StageOps, stages: int, microbatches: int, rank: int) -> None:
    """One step on one stage: each microbatch goes all the way forward and all the way back before the next."""
    for k in range(microbatches):
        x = stage.receive_activation(k)
        out = stage.forward(k, x)
        stage.send_activation(k, out)
        grad = stage.receive_gradient(k)
        grad_in = stage.backward(k, grad)
        stage.send_gradient(k, grad_in)


def schedule(stages: int, microbatches: int, stage: int) -> list[Action]:
    """Stage `stage`'s actions for one step: F0 B0 F1 B1 ... (the same on every stage)."""
    out: list[Action] = []
    for k in range(microbatches):
        out += [("F", k), ("B", k)]
    return out
