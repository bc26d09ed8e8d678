"""Pipeline schedules simulated for up to 64 stages and 256 microbatches, with costs measured on the cluster.

Each stage runs its schedule's actions in order (the same naive, GPipe and 1F1B functions the live engine runs);
an action starts when its stage is free and its input has arrived: F(k) on stage s needs F(k) of stage s-1 plus
one message, B(k) needs B(k) of stage s+1 plus one message. Forward, backward and message times come from a
real run's trace (calibrate_pipeline), and the result has the live run's trace columns, so the chapter's
timeline, bubble and memory plots draw simulated runs unchanged.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import pandas as pd

from ..config import Config, check_choice, check_float, check_int
from ..pipeline.experiment import PipelineConfig, measured_bubble, run_pipeline
from ..pipeline.schedules import SCHEDULES, ideal_bubble
from ..trace import OnUpdate, Result, to_frame

MAX_SIM_STAGES, MAX_SIM_MICROBATCHES = 64, 256
SIM_SCHEDULES = (*SCHEDULES, "decoupled")  # decoupled: GPipe's order, but a backward waits for no other stage


@dataclass(frozen=True)
class PipelineSimConfig(Config):
    """`stages` equal stages, `microbatches` per step, each forward/backward/message taking the given seconds."""

    stages: int = 8
    microbatches: int = 32
    schedule: str = "1f1b"
    forward_s: float = 1e-3
    backward_s: float = 2e-3
    link_s: float = 1e-4

    def validate(self) -> None:
        check_int("stages", self.stages, 1, MAX_SIM_STAGES)
        check_int("microbatches", self.microbatches, 1, MAX_SIM_MICROBATCHES)
        check_choice("schedule", self.schedule, SIM_SCHEDULES)
        check_float("forward_s", self.forward_s, 0.0, 3600.0, lo_open=True)
        check_float("backward_s", self.backward_s, 0.0, 3600.0, lo_open=True)
        check_float("link_s", self.link_s, 0.0, 3600.0)


def simulate_schedule(config: PipelineSimConfig,
                      durations: dict[tuple[str, int, int], float] | None = None) -> pd.DataFrame:
    """Start, duration and activations held of every action of one step (one row each).

    `durations` maps (kind, microbatch, stage) to seconds, replacing the config's equal forward and backward times.
    """
    p, m = config.stages, config.microbatches
    decoupled = config.schedule == "decoupled"
    actions = [SCHEDULES["gpipe" if decoupled else config.schedule](p, m, s) for s in range(p)]
    done: dict[tuple[str, int, int], float] = {}  # (kind, microbatch, stage) -> finish time
    free, nxt, held = [0.0] * p, [0] * p, [0] * p
    rows, remaining = [], sum(len(a) for a in actions)
    while remaining:
        progressed = False
        for s in range(p):
            while nxt[s] < len(actions[s]):
                kind, k = actions[s][nxt[s]]
                if kind == "F":
                    dep = None if s == 0 else ("F", k, s - 1)
                else:
                    dep = ("F", k, s) if s == p - 1 else None if decoupled else ("B", k, s + 1)
                if dep is not None and dep not in done:
                    break
                ready = 0.0 if dep is None else done[dep] + (config.link_s if dep[2] != s else 0.0)
                start = max(free[s], ready)
                if nxt[s] and start > free[s]:  # blocked on a message after the stage has begun: traced as idle
                    rows.append({"worker": s, "step": 0, "event": "idle", "microbatch": k, "t_start": free[s],
                                 "duration": start - free[s], "held": held[s], "time": start})
                duration = config.forward_s if kind == "F" else config.backward_s
                if durations is not None:
                    duration = durations[(kind, k, s)]
                free[s] = done[(kind, k, s)] = start + duration
                held[s] += 1 if kind == "F" else -1
                rows.append({"worker": s, "step": 0, "event": "forward" if kind == "F" else "backward",
                             "microbatch": k, "t_start": start, "duration": duration, "held": held[s],
                             "time": start + duration})
                nxt[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError("the schedules of neighbouring stages wait for each other (deadlock)")
    return to_frame(rows)


def run_pipeline_simulated(config: PipelineSimConfig, client: Any = None, on_update: OnUpdate | None = None) -> Result:
    """Simulate one step; summary has the step time, the bubble and the most activations held."""
    t0 = time.perf_counter()
    trace = simulate_schedule(config)
    bubble = measured_bubble(trace)
    summary: dict[str, Any] = {
        "wall_s": time.perf_counter() - t0,
        "step_s": float(bubble.span_s.iloc[0]),
        "bubble": float(bubble.bubble.iloc[0]),
        "ideal_bubble": ideal_bubble(config.stages, config.microbatches, config.schedule,
                                     config.backward_s / config.forward_s),
        "max_held": int(trace.held.max()),
    }
    return Result(config, trace, summary)


def bubble_with_free_messages(trace: pd.DataFrame, config: PipelineConfig) -> float:
    """Median bubble of a real run's steps replayed with their measured action times but free, instant messages.

    It lies between the formula (equal actions) and the measured bubble: what is left above the formula comes
    from actions of unequal length, what is left below the measured bubble from messages and bookkeeping.
    """
    work = trace[trace.event.isin(["forward", "backward"])]
    steps = sorted(set(work.step) - {0}) or sorted(set(work.step))
    sim = PipelineSimConfig(stages=config.stages, microbatches=config.microbatches, link_s=0.0,
                            schedule="gpipe" if config.schedule == "decoupled" and config.gradient_delay == 0
                            else config.schedule)
    bubbles = []
    for step in steps:
        rows = work[work.step == step]
        durations = {(e[0].upper(), int(k), int(w)): float(d)
                     for e, k, w, d in zip(rows.event, rows.microbatch, rows.worker, rows.duration, strict=True)}
        bubbles.append(float(measured_bubble(simulate_schedule(sim, durations)).bubble.iloc[0]))
    return float(pd.Series(bubbles).median())


def calibrate_pipeline(config: PipelineConfig, client: Any) -> dict[str, float]:
    """Per-microbatch forward and backward seconds of one stage, and the message time, from a real naive run.

    The naive schedule has no overlap, so its step is the sum of its actions and messages: the message time is
    what is left of the measured step once the forwards and backwards are taken out.
    """
    real = run_pipeline(config.replace(schedule="naive"), client)
    trace = real.trace[real.trace.step > 0] if real.trace.step.max() > 0 else real.trace
    fwd = float(trace[trace.event == "forward"].duration.median())
    bwd = float(trace[trace.event == "backward"].duration.median())
    span = float(measured_bubble(trace).span_s.median())
    p, m = config.stages, config.microbatches
    messages = 2 * (p - 1) * m
    link = max(0.0, (span - p * m * (fwd + bwd)) / messages) if messages else 0.0
    return {"forward_s": fwd, "backward_s": bwd, "link_s": link, "measured_naive_step_s": span}


def simulated_from(config: PipelineConfig, costs: dict[str, float], **changes: Any) -> PipelineSimConfig:
    """The simulator's config for `config` (schedule, stages, microbatches) with calibrated costs."""
    schedule = "gpipe" if config.schedule == "decoupled" and config.gradient_delay == 0 else config.schedule
    fields = {"stages": config.stages, "microbatches": config.microbatches, "schedule": schedule,
              "forward_s": costs["forward_s"], "backward_s": costs["backward_s"], "link_s": costs["link_s"]}
    return PipelineSimConfig(**{**fields, **changes})


def bubble_table(base: PipelineSimConfig, stages: tuple[int, ...], microbatches: tuple[int, ...]) -> pd.DataFrame:
    """Simulated bubble and step time over a grid of stages x microbatches (plot_bubble draws it)."""
    rows = []
    for p in stages:
        for m in microbatches:
            r = run_pipeline_simulated(base.replace(stages=p, microbatches=m))
            rows.append({"stages": p, "microbatches": m, "bubble": r.summary["bubble"], "step_s": r.summary["step_s"],
                         "ideal_bubble": r.summary["ideal_bubble"], "max_held": r.summary["max_held"]})
    return pd.DataFrame(rows)




def plot_simulated_pipeline(result: Result) -> Any:
    """Figure for the CLI: the simulated step's timeline (one row per stage)."""
    import matplotlib.pyplot as plt

    from ..pipeline.plots import plot_timeline

    p = result.config.stages
    fig, ax = plt.subplots(figsize=(10, 1.0 + 0.3 * min(p, 64)))
    plot_timeline(ax, result.trace, step=0, label=p * result.config.microbatches <= 256)
    fig.tight_layout()
    return fig
