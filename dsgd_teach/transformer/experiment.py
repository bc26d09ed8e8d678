"""Chapter 10's experiment: predict a layout's step, then train it on the cluster and set the two side by side.

`run(config, client)` calibrates on the cluster once per (cluster, model shape, threads) (the course's own training
step timed on one rank at two batch sizes, ring attention's blocks, the cores, chapter 05's ping-pong for α and β,
and α, β and the compute share among 2, 4 and 8 ranks that compute between messages, `busy_link.py`), prints the
prediction (step time, bytes each rank sends on each axis, memory each rank holds) before training, trains the
layout with `composed.run_composed` (every rank's loss, step time, bytes per axis and memory in the trace), and
prints and returns predicted against measured.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from distributed import Client

from ..collectives.cost_model import AlphaBeta, fit_alpha_beta
from ..collectives.experiment import run_session
from ..collectives.session import Plan as SessionPlan
from ..config import check_bool, sized
from ..machine import cpu_count
from ..runtime.clusters.worker_settings import release_free_memory
from ..runtime.clusters.workers import get_workers
from ..trace import OnUpdate, Result
from .busy_link import measure_busy_links
from .calibration import Calibration, predict_step, time_ring_attention
from .composed import ComposedConfig, run_composed
from .mesh import AXES
from .model import GPTShape
from .oracle import cached_oracle, compare_with_oracle
from .predict import Plan, axis_bytes, flops_per_step, memory_per_rank

#: The chapter's model: 2 layers, h = 96 in smoke mode (239 thousand parameters); 4 layers, h = 256 in full mode
#: (3.2 million), short sequences of a small vocabulary, so that eight ranks on two cores train it in seconds. Full
#: mode fits Binder's 2 GiB because the kernel keeps no rank's parameters (run compares them with the oracle as it
#: ends), every rank hands back the heap it freed, and no rank imports sympy (composed.backward_from): the browser
#: test's peak went from 2431 to 1731 MiB PSS at this size.
SMOKE_SHAPE = GPTShape(vocab=64, seq_len=32, width=96, heads=4, layers=2)
FULL_SHAPE = GPTShape(vocab=64, seq_len=32, width=256, heads=4, layers=4)


def chapter_shape() -> GPTShape:
    """FULL_SHAPE, or SMOKE_SHAPE under DSGD_SMOKE=1."""
    return sized(FULL_SHAPE, SMOKE_SHAPE)


#: The chapter's composed layouts by the ranks they take: two meshes of three axes on 8 ranks, and the two-axis
#: and one-axis layouts a smaller cluster can still run (each axis of size 2).
CHAPTER_MESHES: dict[int, dict[str, dict[str, Any]]] = {
    8: {"dp2·tp2·pp2": dict(dp=2, tp=2, pp=2), "tp2·pp2·cp2 + SP": dict(tp=2, pp=2, cp=2, sequence_parallel=True)},
    4: {"dp2·tp2": dict(dp=2, tp=2), "pp2·cp2": dict(pp=2, cp=2)},
    2: {"tp2 + SP": dict(tp=2, sequence_parallel=True), "pp2": dict(pp=2)},
    1: {"one rank": {}},
}


def chapter_meshes(client: Client, ranks: int = 8) -> dict[str, dict[str, Any]]:
    """The chapter's layouts of `ranks` ranks (a key of CHAPTER_MESHES); on a deployment the course may not grow
    and that has fewer workers, the widest layouts that fit, after printing what more workers would show."""
    if ranks not in CHAPTER_MESHES:
        raise ValueError(f"ranks must be one of {sorted(CHAPTER_MESHES)}, got {ranks!r}")
    got = get_workers(client, ranks, why=f"the layouts of {ranks} ranks")
    if not got.enough:
        print(got.note)
    return CHAPTER_MESHES[max(n for n in CHAPTER_MESHES if n <= min(ranks, got.n))]


@dataclass(frozen=True)
class TransformerConfig(ComposedConfig):
    """A layout of the chapter's GPT, trained `steps` SGD steps; predicted first (calibrated on the cluster)."""

    shape: GPTShape = SMOKE_SHAPE
    batch: int = 16
    microbatches: int = 2
    steps: int = 6
    predict: bool = True  # calibrate and predict before training
    verbose: bool = True  # print the prediction before training and predicted against measured after
    check: bool = True  # compare every rank with the single-process model after training (oracle_gap)

    def validate(self) -> None:
        super().validate()
        check_bool("predict", self.predict)
        check_bool("verbose", self.verbose)
        check_bool("check", self.check)

    @property
    def plan(self) -> Plan:
        """The layout and batch as predict.py reads them (plain SGD, GPipe's microbatches)."""
        return Plan(dp=self.dp, tp=self.tp, pp=self.pp, cp=self.cp, ep=self.ep, batch=self.batch,
                    microbatches=self.microbatches, sequence_parallel=self.sequence_parallel,
                    balanced=self.balanced, optimizer="sgd")


@dataclass
class TransformerExtras:
    """A run's extras: the calibration used, the predicted and measured step, bytes and memory, each rank's mesh
    coordinates, and (with check=True) the largest differences from the single-process model."""

    calibration: Calibration | None
    prediction: dict[str, Any]
    comparison: pd.DataFrame
    ranks: list[dict[str, Any]]
    oracle: dict[str, float] | None = None


_CALIBRATIONS: dict[tuple[Any, ...], Calibration] = {}
#: The rank counts whose busy links the calibration measures (those the cluster has workers for).
BUSY_RANKS = (2, 4, 8)
#: Megatron's collectives per layer, forward and backward (f and g, twice each): the calibration's busy ranks
#: compute a layer's fixed cost and FLOPs on one microbatch, over this many, between messages.
COLLECTIVES_PER_LAYER = 4
#: Sequences in one microbatch of the chapter's runs (TransformerConfig's batch 16 in 2 microbatches).
MICROBATCH_ROWS = 8


def measure_link(client: Client, timeout_s: float = 60.0, repeats: int = 5) -> AlphaBeta:
    """α and β of the cluster's links: chapter 05's ping-pong between two ranks, fitted by its cost model."""
    sizes = tuple(2**j for j in range(6, 21, 2))
    plan = SessionPlan(pingpong_sizes=sizes, pingpong_repeats=repeats)
    _, results, _, _ = run_session(client, 2, plan, device="cpu", timeout_s=timeout_s, run_timeout_s=10 * timeout_s)
    ping = results[0]["pingpong"]
    return fit_alpha_beta(np.array([p[0] for p in ping], dtype=float), np.array([p[1] for p in ping]))


def calibrate(client: Client, shape: GPTShape, threads: int = 1, timeout_s: float = 60.0,
              refresh: bool = False) -> Calibration:
    """This cluster's Calibration for `shape` (measured once, then remembered until refresh=True)."""
    key = (client.scheduler.address if client.scheduler else id(client), shape, threads)
    if refresh or key not in _CALIBRATIONS:
        rate, overhead = fit_one_rank(client, shape, threads, timeout_s)
        cores = client.submit(cpu_count, pure=False).result(timeout=timeout_s)
        workers = len(client.scheduler_info(n_workers=-1)["workers"])
        link = measure_link(client, timeout_s)
        # what a rank computes between two of a layer's collectives: the layer's fixed cost and its FLOPs on one
        # microbatch of the chapter's (MICROBATCH_ROWS sequences), over the layer's collectives
        layer_s = overhead + flops_per_step(shape, MICROBATCH_ROWS) / shape.layers / rate
        gap = layer_s / COLLECTIVES_PER_LAYER
        measured = {n: measure_busy_links(client, n, gap, link, timeout_s) for n in BUSY_RANKS if n <= workers}
        busy = tuple((n, g, ring) for n, (_, rings) in measured.items() for g, ring in rings.items())
        shares = tuple((n, share) for n, (share, _) in measured.items())
        ring_fixed, ring_block = client.submit(time_ring_attention, shape, MICROBATCH_ROWS,
                                               pure=False).result(timeout=timeout_s)
        _CALIBRATIONS[key] = Calibration(rate, overhead, int(cores), link, busy, shares, ring_fixed, ring_block)
    return _CALIBRATIONS[key]


def fit_one_rank(client: Client, shape: GPTShape, threads: int = 1, timeout_s: float = 60.0,
                 batches: tuple[int, ...] = (2, 8)) -> tuple[float, float]:
    """(FLOP/s, seconds per layer and microbatch) of one rank running the course's own training step (the composed
    loop on a layout of one rank) at two batch sizes: t = L·overhead + FLOPs / rate, fitted to the median of 11
    steps each (the first, which warms up, left out; with 3 a fresh cluster's noise put the one-rank prediction 30 %
    off)."""
    flops, seconds = [], []
    for batch in batches:
        config = ComposedConfig(shape=shape, batch=batch, microbatches=1, steps=12, threads=threads,
                                timeout_s=timeout_s)
        ups = run_composed(config, client).trace
        ups = ups[(ups.event == "update") & (ups.step > 0)]
        flops.append(flops_per_step(shape, batch))
        seconds.append(float(ups.step_s.median()))
    slope, intercept = np.polyfit(np.array(flops), np.array(seconds), 1)
    if slope <= 0:  # noise hid the FLOPs' share: all of it is rate
        return float(flops[-1] / seconds[-1]), 0.0
    return float(1.0 / slope), float(max(intercept, 0.0) / shape.layers)


def prediction(config: TransformerConfig, cal: Calibration | None) -> dict[str, Any]:
    """What the formulas say of this run: step time (with a calibration), and per stage bytes and memory."""
    shape, plan = config.shape, config.plan
    stages = {st: {"bytes": axis_bytes(shape, plan, st), "memory": memory_per_rank(shape, plan, st, "gpipe")}
              for st in range(plan.pp)}
    out: dict[str, Any] = {"flops_per_step": flops_per_step(shape, plan.batch), "stages": stages}
    if cal is not None:
        out["step"] = predict_step(shape, plan, cal)
    return out


def compare(config: TransformerConfig, predicted: dict[str, Any], trace: pd.DataFrame) -> pd.DataFrame:
    """Predicted against measured, per quantity: median step time, bytes per axis and memory of the busiest rank."""
    ups = trace[trace.event == "update"]
    rows: list[dict[str, Any]] = []
    if not len(ups):
        return pd.DataFrame(columns=["quantity", "predicted", "measured", "ratio"])
    steps = ups[ups.step > 0] if ups.step.nunique() > 1 else ups  # step 0 warms the allocator and the links up
    if "step" in predicted:
        rows.append({"quantity": "step time (s)", "predicted": predicted["step"]["step_s"],
                     "measured": float(steps.groupby("step").step_s.max().median())})
    stages = predicted["stages"]
    for axis in AXES:
        want = max(s["bytes"][axis] + (s["bytes"]["edp"] if axis == "dp" else 0) for s in stages.values())
        got = float(ups.groupby("worker")[f"bytes_{axis}"].median().max())
        if want or got:
            rows.append({"quantity": f"bytes sent on {axis}", "predicted": want, "measured": got})
    held = (ups.activation_bytes + ups.state_bytes).groupby(ups.worker).max()
    rows.append({"quantity": "memory held (bytes)", "measured": float(held.max()),
                 "predicted": max(s["memory"]["total"] for s in stages.values())})
    frame = pd.DataFrame(rows)
    frame["ratio"] = frame.predicted / frame.measured
    return frame


def run(config: TransformerConfig, client: Client, on_update: OnUpdate | None = None) -> Result:
    """Predict, train the layout on the cluster, compare: a Result whose extras hold both sides."""
    # the calibration times CPU ranks: a run on GPUs gets its bytes and memory predicted, not its step time
    on_cpu = config.device == "cpu"
    cal = calibrate(client, config.shape, config.threads, config.timeout_s) if config.predict and on_cpu else None
    if config.predict and not on_cpu and config.verbose:
        print(f"device={config.device!r}: the step time is not predicted (the calibration measures CPU ranks)")
    predicted = prediction(config, cal)
    if config.verbose:
        print(describe_prediction(config, predicted))
    result = run_composed(config, client, on_update)
    table = compare(config, predicted, result.trace)
    summary = dict(result.summary)
    for row in table.itertuples():
        summary[f"predicted {row.quantity}"] = float(row.predicted)
        summary[f"measured {row.quantity}"] = float(row.measured)
    if config.verbose:
        print(table.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    gap, done = None, int(result.summary["steps"])
    if config.check and done:  # compared here, so that the kernel keeps each rank's coordinates, not its parameters
        trained = config.replace(steps=done) if result.stopped else config  # every rank stops after the same step
        gap = compare_with_oracle(result, trained, cached_oracle(trained))
        summary.update({"max_loss_diff_vs_oracle": gap["loss"], "max_param_diff_vs_oracle": gap["params"]})
    ranks = [{"coords": out["coords"]} for out in result.extras or []]
    release_free_memory()  # the oracle's and the ranks' arrays, freed, leave holes in the kernel's heap
    return Result(config, result.trace, summary, None, result.stopped,
                  TransformerExtras(cal, predicted, table, ranks, gap))


def oracle_gap(result: Result) -> dict[str, float]:
    """The largest differences of a run from the single-process model: in any step's loss and any rank's slice
    (measured when the run ended; a run_composed Result, whose extras keep the parameters, is compared now)."""
    if isinstance(result.extras, TransformerExtras):
        if result.extras.oracle is None:
            raise ValueError("this run was not compared with the single-process model: run it with check=True")
        return dict(result.extras.oracle)
    return compare_with_oracle(result, result.config)


def describe_prediction(config: TransformerConfig, predicted: dict[str, Any]) -> str:
    """One paragraph: the layout, and what it is predicted to take, send and hold."""
    plan = config.plan
    head = (f"predicted for dp={plan.dp} tp={plan.tp} pp={plan.pp} cp={plan.cp} ep={plan.ep} "
            f"({plan.ranks} ranks), B={plan.batch}, m={plan.microbatches}: "
            f"{predicted['flops_per_step'] / 1e9:.3g} GFLOP per step")
    if "step" in predicted:
        head += f", {predicted['step']['step_s'] * 1e3:.1f} ms per step"
    sent = {a: max(s["bytes"][a] + (s["bytes"]["edp"] if a == "dp" else 0) for s in predicted["stages"].values())
            for a in AXES}
    memory = max(s["memory"]["total"] for s in predicted["stages"].values())
    return (head + "; bytes per rank per step " + ", ".join(f"{a} {v:,.0f}" for a, v in sent.items() if v)
            + f"; memory per rank {memory / 2**20:.2f} MiB")
