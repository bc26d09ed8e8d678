"""The pipeline experiment: config, run on the live cluster (one stage per worker), and the single-process oracle."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from distributed import Client
from torch import nn

from ..config import Config, check_bool, check_choice, check_float, check_int, check_seed, check_timeout
from ..runtime.ranks.group import DEVICES
from ..runtime.ranks.group_run import run_group
from ..sampling import batch_indices
from ..trace import OnUpdate, Result, stat
from .decoupled import decoupled_rank
from .rank_loop import pipeline_rank
from .rank_support import training_data
from .schedules import SCHEDULES, ideal_bubble
from .stages import PIPELINE_MODELS, build_units, stage_bounds

SCHEDULE_NAMES = (*SCHEDULES, "decoupled")
JOIN_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class PipelineExtras:
    """A run's extras: the flat gradient of the last step (every stage's, in order) and each stage's peak of
    activations held for backward."""

    grads: np.ndarray | None
    peak_held: list[int]


@dataclass(frozen=True)
class PipelineConfig(Config):
    """Train a `depth`-layer MLP (or the course CNN) on digits split into `stages` stages, one per worker.

    With replicas > 1, each of `replicas` copies of the pipeline takes an equal share of the batch and the
    copies of each stage average their gradients (hybrid parallelism). Each step's batch is cut into
    `microbatches` pieces run by `schedule`; "decoupled" (Huo et al., 2018; decoupled.py) lets stage s
    back-propagate the batch of gradient_delay*(stages-1-s) steps ago, without waiting for the next stage.

    Emulated devices: with emulated_forward_s > 0 every forward lasts at least that long and every backward at
    least emulated_backward_s (default: twice the forward), as if each stage had an accelerator of its own; the
    stage computes for real, then sleeps the rest (engine.emulate_device). The trace labels the sleep `injected_s`.
    This shows the pipeline's schedule on a machine with fewer cores than stages, where real computation would
    make the stages take turns on the cores instead of overlapping.

    pin_stages runs each CPU stage on a core of its own (the i-th stage on a machine on its i-th core), as each
    stage of a real pipeline has a device of its own (runtime/ranks/group.py says what it saves).
    """

    model: str = "mlp"
    depth: int = 8
    hidden: int = 64
    stages: int = 2
    replicas: int = 1
    microbatches: int = 4
    schedule: str = "gpipe"
    gradient_delay: int = 1
    steps: int = 30
    batch_size: int = 64
    lr: float = 0.1
    seed: int = 0
    n_samples: int | None = None
    device: str = "auto"
    timeout_s: float = 20.0
    run_timeout_s: float = 600.0
    emulated_forward_s: float = 0.0
    emulated_backward_s: float | None = None
    pin_stages: bool = True

    def validate(self) -> None:
        check_choice("model", self.model, PIPELINE_MODELS)
        check_float("emulated_forward_s", self.emulated_forward_s, 0.0, 10.0)
        if self.emulated_backward_s is not None:
            check_float("emulated_backward_s", self.emulated_backward_s, 0.0, 10.0)
        check_int("depth", self.depth, 1, 64)
        check_int("hidden", self.hidden, 1, 8192)
        check_int("stages", self.stages, 1, self.n_units)
        check_int("batch_size", self.batch_size, 1, 100_000)
        check_int("replicas", self.replicas, 1, 4)
        if self.stages * self.replicas > 16:
            raise ValueError(f"stages * replicas must be at most 16 workers, got {self.stages} * {self.replicas}")
        check_int("microbatches", self.microbatches, 1, min(256, self.batch_size // self.replicas))
        check_choice("schedule", self.schedule, SCHEDULE_NAMES)
        check_int("gradient_delay", self.gradient_delay, 0, 16)
        check_int("steps", self.steps, 1, 1_000_000)
        check_float("lr", self.lr, 0.0, 100.0, lo_open=True)
        check_seed(self.seed)
        if self.n_samples is not None:
            check_int("n_samples", self.n_samples, 10, 1_000_000)
        check_choice("device", self.device, DEVICES)
        check_timeout("timeout_s", self.timeout_s)
        check_timeout("run_timeout_s", self.run_timeout_s, 86400.0)
        check_bool("pin_stages", self.pin_stages)

    @property
    def world(self) -> int:
        """Workers the run needs: one per stage of every replica."""
        return self.stages * self.replicas

    @property
    def n_units(self) -> int:
        """How many units the model has: the most stages it can be split into."""
        return 4 if self.model == "cnn" else self.depth

    @property
    def emulated(self) -> bool:
        """True when forwards and backwards last an emulated device's time (injected sleep) instead of only theirs."""
        return self.emulated_forward_s > 0 or bool(self.emulated_backward_s)

    @property
    def backward_device_s(self) -> float:
        """Emulated time of one backward: emulated_backward_s, or twice the forward's when that is None."""
        return 2 * self.emulated_forward_s if self.emulated_backward_s is None else self.emulated_backward_s

    @property
    def mode(self) -> str:
        """Which mode drew a plot: 'real compute' or 'emulated devices (t_f = .. ms, t_b = .. ms injected)'."""
        if not self.emulated:
            return "real compute"
        return (f"emulated devices (t_f = {self.emulated_forward_s * 1e3:.0f} ms, "
                f"t_b = {self.backward_device_s * 1e3:.0f} ms injected)")

    def stage_staleness(self, stage: int) -> int:
        """Steps between computing and applying a gradient at `stage` (0 except for the decoupled schedule)."""
        return self.gradient_delay * (self.stages - 1 - stage) if self.schedule == "decoupled" else 0


def reference_training(config: PipelineConfig) -> tuple[np.ndarray, np.ndarray, list[float]]:
    """The oracle: the whole model in one process, whole batches, same SGD (and the same per-stage delays).

    Returns (final parameters, the last gradient each stage computed, loss per step), flat in stage order; with
    delays, stage s last computed the gradient of step steps-1-staleness(s) (zeros when there was none).
    """
    X_all, y_all = training_data(config)
    units = build_units(config.model, X_all.shape[1], 10, config.depth, config.hidden, config.seed)
    model = nn.Sequential(*units)
    bounds = stage_bounds(len(units), config.stages)
    groups = [[p for u in units[a:b] for p in u.parameters()] for a, b in bounds]
    waiting: list[list[list[torch.Tensor]]] = [[] for _ in bounds]
    computed: list[list[list[torch.Tensor]]] = []  # per step, each stage's gradient of that step's batch
    losses = []
    for step in range(config.steps):
        idx = batch_indices(len(y_all), config.batch_size, step, config.seed)
        model.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(torch.as_tensor(X_all[idx])), torch.as_tensor(y_all[idx]))
        loss.backward()
        losses.append(float(loss.item()))
        computed.append([[p.grad.clone() for p in params] for params in groups])
        with torch.no_grad():
            for s, params in enumerate(groups):
                waiting[s].append(computed[-1][s])
                if len(waiting[s]) > config.stage_staleness(s):
                    for p, g in zip(params, waiting[s].pop(0), strict=True):
                        p -= config.lr * g
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()
    last = [computed[config.steps - 1 - config.stage_staleness(s)][s] if config.steps > config.stage_staleness(s)
            else [torch.zeros_like(p) for p in params] for s, params in enumerate(groups)]
    grads = torch.cat([g.reshape(-1) for stage in last for g in stage]).numpy()
    return flat, grads, losses


def measured_bubble(trace: pd.DataFrame) -> pd.DataFrame:
    """Per step: span from the first action's start to the last's end, busy time, and the idle fraction.

    `bubble` is the idle fraction of all stages together; `bubble_busiest` that of the busiest stage alone, which
    leaves out the idling that comes from stages of unequal speed (the formula assumes equal stages). The bubble
    splits into `waiting` (before a stage's first action, after its last, and blocked on a message: what the
    schedule makes a stage wait) and `overhead` (the rest: posting messages and bookkeeping between actions).
    """
    work = trace[trace.event.isin(["forward", "backward"])]
    if not len(work):
        return pd.DataFrame(columns=["step", "span_s", "busy_s", "bubble", "bubble_busiest", "waiting", "overhead"])
    end = work.t_start + work.duration
    g = work.assign(end=end).groupby("step")
    stages = work.worker.nunique()
    busiest = work.groupby(["step", "worker"]).duration.sum().groupby("step").max()
    out = pd.DataFrame({"span_s": g.end.max() - g.t_start.min(), "busy_s": g.duration.sum(),
                        "busiest_s": busiest}).reset_index()
    out["bubble"] = 1.0 - out.busy_s / (stages * out.span_s)
    out["bubble_busiest"] = 1.0 - out.busiest_s / out.span_s
    out["waiting"] = _waiting(trace, work.assign(end=end)).reindex(out.step).to_numpy() / (stages * out.span_s)
    out["overhead"] = out.bubble - out.waiting
    return out


def _waiting(trace: pd.DataFrame, work: pd.DataFrame) -> pd.Series:
    """Seconds per step the stages spent before their first action, after their last, or in a traced wait."""
    per_stage = work.groupby(["step", "worker"]).agg(first=("t_start", "min"), last=("end", "max"))
    steps = per_stage.groupby("step").agg(start=("first", "min"), stop=("last", "max"))
    per_stage = per_stage.join(steps, on="step")
    edges = (per_stage["first"] - per_stage.start) + (per_stage.stop - per_stage["last"])
    idle = trace.loc[trace.event == "idle", ["step", "worker", "t_start", "duration"]]
    idle = idle.merge(per_stage.reset_index(), on=["step", "worker"])
    inside = idle[(idle.t_start >= idle["first"]) & (idle.t_start < idle["last"])]
    blocked = inside.groupby(["step", "worker"]).duration.sum()
    return edges.add(blocked, fill_value=0.0).groupby("step").sum()


def run_pipeline(config: PipelineConfig, client: Client, on_update: OnUpdate | None = None) -> Result:
    """Train with config.schedule on config.stages workers; params are the stages' parameters joined in order."""
    world = config.stages * config.replicas
    rank_fn = decoupled_rank if config.schedule == "decoupled" and config.gradient_delay > 0 else pipeline_rank
    # joining the group may take the ranks longer than one message on a busy machine (one rank's task starts
    # late): it gets JOIN_TIMEOUT_S at least, while every wait of the training itself keeps config.timeout_s
    run = run_group(client, world, rank_fn, (config,), on_update, device=config.device,
                    timeout_s=max(config.timeout_s, JOIN_TIMEOUT_S), run_timeout_s=config.run_timeout_s,
                    pin_cores=config.pin_stages)
    trace, spec, every = run.trace, run.spec, run.done
    done = [o for o in every if o["replica"] == 0]
    stopped = run.stopped or any(o["stopped"] for o in done)
    updates = trace[trace.event == "update"].sort_values("step")
    bubble = measured_bubble(trace)
    steady = bubble[bubble.step > 0] if len(bubble) > 1 else bubble  # step 0 pays for warming up
    schedule = "gpipe" if config.schedule == "decoupled" and config.gradient_delay == 0 else config.schedule
    work = trace[trace.event.isin(["forward", "backward"])] if len(trace) else trace
    ratio = (float(work[work.event == "backward"].duration.median() / work[work.event == "forward"].duration.median())
             if len(work) else 2.0)
    summary: dict[str, Any] = {
        "mode": config.mode,
        "wall_s": run.wall_s,
        "steps": len(updates),
        "backend": spec.backend,
        "port": spec.port,
        "cores": list(spec.cores),
        "final_loss": stat(updates, "loss", "last"),
        "median_step_s": stat(steady, "span_s"),
        "bubble": stat(steady, "bubble"),
        "bubble_busiest_stage": stat(steady, "bubble_busiest"),
        "bubble_waiting": stat(steady, "waiting"),
        "ideal_bubble": ideal_bubble(config.stages, config.microbatches, schedule, ratio),
        "max_held": int(max((o["peak_held"] for o in done), default=0)),
        "max_replica_divergence": max((float(np.max(np.abs(o["params"] - done[o["stage"]]["params"]), initial=0.0))
                                       for o in every if len(done) == config.stages), default=0.0),
    }
    if config.emulated and len(work):
        # how much of the stages' busy time was injected sleep, and whether real compute ever outran the device
        summary["injected_share"] = float(work.injected_s.sum() / work.duration.sum())
        summary["actions_slower_than_device"] = int((work.injected_s <= 0).sum())
    whole = len(done) == config.stages
    extras = PipelineExtras(np.concatenate([o["grads"] for o in done]) if whole else None,
                            [o["peak_held"] for o in done])
    return Result(config, trace, summary, np.concatenate([o["params"] for o in done]) if whole else None, stopped,
                  extras)


def sweep_microbatches(base: PipelineConfig, client: Client, microbatches: tuple[int, ...]) -> pd.DataFrame:
    """Run `base` once per microbatch count; measured bubble and step time next to (p-1)/(m+p-1)."""
    rows = []
    for m in microbatches:
        result = run_pipeline(base.replace(microbatches=m), client)
        rows.append({"stages": base.stages, "microbatches": m, "schedule": base.schedule,
                     "bubble": result.summary["bubble"], "waiting": result.summary["bubble_waiting"],
                     "ideal_bubble": result.summary["ideal_bubble"],
                     "step_s": result.summary["median_step_s"], "max_held": result.summary["max_held"]})
    return pd.DataFrame(rows)
