"""GPipe (Huang et al., 2019): every microbatch forward, then every microbatch backward, one update per step.

While stage s works on microbatch k, stage s+1 works on k-1: the pipeline fills, runs full, drains. The idle
"bubble" is (p-1)/(m+p-1) of the step when the p stages take equal time, and every stage holds the activations
of all m microbatches until their backward comes ("all forward, all backward", AFAB).
"""

from __future__ import annotations

from .actions import Action, StageOps


def train_step(stage: StageOps, stages: int, microbatches: int, rank: int) -> None:
    """One step on one stage: all m forwards, then all m backwards, the freshest microbatch first."""
    for k in range(microbatches):
        x = stage.receive_activation(k)
        out = stage.forward(k, x)
        stage.send_activation(k, out)
    for k in reversed(range(microbatches)):
        grad = stage.receive_gradient(k)
        grad_in = stage.backward(k, grad)
        stage.send_gradient(k, grad_in)


def schedule(stages: int, microbatches: int, stage: int) -> list[Action]:
    """F0 .. F(m-1), then B(m-1) .. B0 (the last stage starts backward with the freshest microbatch)."""
    return [("F", k) for k in range(microbatches)] + [("B", k) for k in reversed(range(microbatches))]
