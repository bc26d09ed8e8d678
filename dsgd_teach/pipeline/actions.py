"""What a schedule's loop may ask of its stage, and the order of actions a loop performs (for its table's test).

A schedule is a loop over six calls: receive, compute and send, forward and backward, for microbatch k. The
engine's Stage does them for real (messages, autograd, trace events); Recorder only writes down the forwards and
backwards, so a loop's order can be compared with the schedule's table without a cluster.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

Action = tuple[str, int]  # ("F" or "B", microbatch id)


class StageOps(Protocol):
    """One stage's part of one step: the calls a schedule's loop makes, microbatch by microbatch."""

    def receive_activation(self, k: int) -> Any:
        """Microbatch k's input: the batch's rows on the first stage, the previous stage's output elsewhere."""

    def forward(self, k: int, x: Any) -> Any:
        """Run this stage's layers on x (the last stage: and the loss); keep the graph for the backward."""

    def send_activation(self, k: int, out: Any) -> None:
        """Post the output to the next stage (nothing on the last stage)."""

    def receive_gradient(self, k: int) -> Any:
        """The gradient of microbatch k's output, from the next stage (None on the last stage)."""

    def backward(self, k: int, grad: Any) -> Any:
        """Back-propagate microbatch k through the kept graph; the gradient of its input."""

    def send_gradient(self, k: int, grad_in: Any) -> None:
        """Post the input's gradient to the previous stage (nothing on the first stage)."""


class Recorder:
    """A StageOps that does nothing but write down each forward and backward, in order."""

    def __init__(self) -> None:
        self.actions: list[Action] = []

    def receive_activation(self, k: int) -> None:
        return None

    def forward(self, k: int, x: Any) -> None:
        self.actions.append(("F", k))

    def send_activation(self, k: int, out: Any) -> None:
        return None

    def receive_gradient(self, k: int) -> None:
        return None

    def backward(self, k: int, grad: Any) -> None:
        self.actions.append(("B", k))

    def send_gradient(self, k: int, grad_in: Any) -> None:
        return None


TrainStep = Callable[[StageOps, int, int, int], None]  # (stage, stages, microbatches, rank of the stage)


def actions_of(train_step: TrainStep, stages: int, microbatches: int, stage: int) -> list[Action]:
    """The forwards and backwards train_step performs on `stage`, in order."""
    recorder = Recorder()
    train_step(recorder, stages, microbatches, stage)
    return recorder.actions
