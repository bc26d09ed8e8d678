"""Config fields shared by this chapter's experiments, their validation, and the driver-side evaluation hook."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..config import check_choice, check_float, check_int
from ..machine import MAX_WORKERS
from ..problem import Problem, TrainingConfig
from ..trace import OnUpdate, TraceRecorder, stat
from .delays import STRAGGLER_MODELS, DelayModel, frozen_script, validate_script


@dataclass(frozen=True)
class ChapterConfig(TrainingConfig):
    """Fields every sync/async experiment has: the problem, the optimiser, the straggler model, the budget."""

    workers: int = 2
    straggler: str = "none"
    severity: float = 0.0
    delay_script: tuple[tuple[float, ...], ...] | None = None
    timeout_s: float = 60.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "delay_script", frozen_script(self.delay_script))
        super().__post_init__()

    def validate(self) -> None:
        super().validate()
        check_int("workers", self.workers, 1, MAX_WORKERS)
        check_choice("straggler", self.straggler, STRAGGLER_MODELS)
        check_float("severity", self.severity, 0.0, 10.0)
        check_float("timeout_s", self.timeout_s, 1.0, 3600.0)
        if self.delay_script is not None:
            validate_script(self.delay_script, self.world)

    @property
    def world(self) -> int:
        """Worker processes the run uses (subclasses add backups)."""
        return self.workers

    def delay_model(self) -> DelayModel:
        """The straggler model of this run over all its worker processes."""
        return DelayModel(self.straggler, self.severity, self.seed, self.world, self.delay_script)


class EvalRecorder(TraceRecorder):
    """A TraceRecorder that evaluates parameter snapshots riding on events (key `params`) on the driver.

    Workers attach a snapshot every eval_every steps; the driver turns it into an "eval" event with the full
    training loss and the test accuracy, so the cluster never pays for evaluation.
    """

    def __init__(self, problem: Problem, on_update: OnUpdate | None = None) -> None:
        super().__init__(on_update)
        self.problem = problem

    def record(self, **event: Any) -> dict[str, Any]:
        params = event.pop("params", None)
        row = super().record(**event)
        if params is not None:
            metrics = self.problem.evaluate(np.asarray(params, dtype=np.float32))
            super().record(
                time=row["time"], step=row["step"], event="eval", loss=metrics["train_loss"],
                version_applied=row.get("version_applied", -1), **metrics,
            )
        return row


def summarize(trace: Any, t_start: float, extra: dict[str, float]) -> dict[str, float]:
    """Summary metrics common to every run of the chapter."""
    evals = trace[trace.event == "eval"]
    return {
        "wall_s": time.perf_counter() - t_start,
        "final_train_loss": stat(evals, "train_loss", "last"),
        "final_test_accuracy": stat(evals, "test_accuracy", "last"),
        "injected_delay_s": float(trace.injected_delay.sum()) if len(trace) else 0.0,
        **extra,
    }

