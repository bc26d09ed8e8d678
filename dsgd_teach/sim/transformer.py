"""Chapter 10's layouts on 64 to 4096 GPUs: its formulas, called here, for GPT-3's sizes on a two-level network.

Chapter 10 predicts a layout's step from formulas stated once: `transformer/predict.py` counts the FLOPs per
token, the messages and elements one rank sends on each mesh axis and the memory one rank holds; its
`calibration.predict_step` turns them into seconds (each rank's share of the step's FLOPs at a FLOP/s, stretched by
the pipeline's bubble (p-1)/m, plus each axis's messages under chapter 05's α-β model, nothing overlapped), and
`rank_layouts` ranks the layouts of its toy model on 8 ranks. This module calls the same functions for a
paper-sized GPT on thousands of GPUs. It adds only the machine:

* GPUs sit `gpus_per_node` to a node. Ranks are numbered as chapter 10's mesh numbers them (`mesh.MESH_ORDER`,
  pp, dp, cp, tp outermost first: the tensor axis varies fastest, so that it stays inside a node, Narayanan et al.
  2021, section 3.3). A group of an axis is then `stride · size` consecutive ranks (stride: the product of the
  sizes of the axes after it), and every group of the axis stays inside one node exactly when that block divides
  `gpus_per_node`.
* Two α-β links: inside a node (NVLink) and between nodes (one InfiniBand port per GPU). A ring is as slow as its
  slowest hop, so an axis whose groups leave their node pays the network's α and β on all its messages.
* `predict_step` is evaluated once with each link; each axis takes its time from its own link. Compute and bubble
  do not depend on the links.
* A layout fits when the busiest pipeline stage's `memory_per_rank` is at most the GPU's memory.

The shapes are GPT-3's (Brown et al. 2020, Table 2.1: layers, d_model = h, heads, 2048-token context and the
batch in tokens), with GPT-2's vocabulary of 50257 tokens that GPT-3 keeps (Radford et al. 2019, section 2.2).
The default machine is the one Narayanan et al. (2021, section 5) trained on: A100 80 GB GPUs, 8 to a node on
NVLink (600 GB/s both ways, 300 GB/s each way), each with its own 200 Gb/s InfiniBand port (25 GB/s), at the
150e12 FLOP/s chapter 11's ZeRO reproduction assumes; α = 5 µs on both links is an assumption, as it is there.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import ClassVar

import pandas as pd

from ..collectives.cost_model import AlphaBeta
from ..config import Config, check_float, check_int
from ..transformer.calibration import Calibration, describe, predict_step
from ..transformer.mesh import MESH_ORDER
from ..transformer.model import GPTShape
from ..transformer.predict import AXES, LINKS, Plan, flops_per_step, memory_per_rank, param_count

#: The most GPUs a layout may use here.
MAX_GPUS = 4096
GIB = 2**30


@dataclass(frozen=True)
class PaperShape(GPTShape):
    """A GPTShape as large as the papers' (h up to 65536, V up to 2^20): only counted, never built."""

    def validate(self) -> None:
        check_int("vocab", self.vocab, 2, 1 << 20)
        check_int("seq_len", self.seq_len, 1, 1 << 20)
        check_int("width", self.width, 1, 1 << 16)
        check_int("heads", self.heads, 1, self.width)
        if self.width % self.heads:
            raise ValueError(f"heads must divide width={self.width}, got heads={self.heads}")
        check_int("layers", self.layers, 1, 1024)
        check_int("mlp_ratio", self.mlp_ratio, 1, 16)
        check_int("experts", self.experts, 0, 1024)
        check_int("top_k", self.top_k, 1, max(1, self.experts))
        check_float("capacity_factor", self.capacity_factor, 0.0, 64.0, lo_open=True)


@dataclass(frozen=True)
class ScalePlan(Plan):
    """predict.Plan with each axis and the whole layout up to MAX_GPUS ranks, batches up to 2^24 sequences and up to
    2^20 microbatches (Plan stops at 64 ranks an axis and 1024 microbatches)."""

    max_axis: ClassVar[int] = MAX_GPUS
    max_ranks: ClassVar[int] = MAX_GPUS
    max_batch: ClassVar[int] = 1 << 24
    max_microbatches: ClassVar[int] = 1 << 20


def _gpt3(layers: int, width: int, heads: int) -> PaperShape:
    return PaperShape(vocab=50_257, seq_len=2048, width=width, heads=heads, layers=layers)


#: GPT-3's sizes (Brown et al. 2020, Table 2.1) and the batch of each, in 2048-token sequences: their 1M, 2M and
#: 3.2M tokens, rounded to 512, 1024 and 1536 sequences so that powers of two divide them. (The table's XL and 13B
#: rows list heads times d_head unequal to d_model; they are left out.)
GPT3: dict[str, tuple[PaperShape, int]] = {
    "GPT-3 2.7B": (_gpt3(32, 2560, 32), 512),
    "GPT-3 6.7B": (_gpt3(32, 4096, 32), 1024),
    "GPT-3 175B": (_gpt3(96, 12288, 96), 1536),
}


@dataclass(frozen=True)
class Cluster(Config):
    """GPUs of one FLOP/s and memory, `gpus_per_node` to a node; an α-β link inside a node and one between nodes."""

    gpus_per_node: int = 8
    flops_per_s: float = 150e12
    memory_gib: float = 80.0
    intra: AlphaBeta = AlphaBeta(5e-6, 1 / 300e9)  # NVLink: 300 GB/s each way
    inter: AlphaBeta = AlphaBeta(5e-6, 1 / 25e9)  # one 200 Gb/s InfiniBand port per GPU
    order: tuple[str, ...] = field(default=MESH_ORDER)  # the mesh's axes, outermost first (chapter 10's)

    def validate(self) -> None:
        check_int("gpus_per_node", self.gpus_per_node, 1, MAX_GPUS)
        check_float("flops_per_s", self.flops_per_s, 0.0, 1e18, lo_open=True)
        check_float("memory_gib", self.memory_gib, 0.0, 1e6, lo_open=True)
        for name in ("intra", "inter"):
            link = getattr(self, name)
            if not isinstance(link, AlphaBeta) or link.alpha < 0 or link.beta < 0:
                raise ValueError(f"{name} must be an AlphaBeta with alpha, beta >= 0, got {link!r}")
        if sorted(self.order) != sorted(MESH_ORDER):
            raise ValueError(f"order must list the axes {', '.join(MESH_ORDER)} once each, got {self.order!r}")


def group_blocks(plan: Plan, order: tuple[str, ...] = MESH_ORDER) -> dict[str, int]:
    """For each link, how many consecutive ranks one of its groups spans: stride · size, where stride is the product
    of the sizes of the axes after it in `order` (dp splits into edp, ep outermost first, as mesh.Layout.dims)."""
    dims: list[tuple[str, int]] = []
    for axis in order:
        dims += [("edp", plan.dp // plan.ep), ("ep", plan.ep)] if axis == "dp" else [(axis, getattr(plan, axis))]
    stride, out = 1, {}
    for name, size in reversed(dims):
        out[name] = stride * size
        stride *= size
    out["dp"] = out["edp"]  # the whole dp group: its edp and ep parts together
    return out


def links_across_nodes(plan: Plan, cluster: Cluster) -> set[str]:
    """The links (of predict.LINKS) whose groups have more than one rank and leave their node."""
    blocks = group_blocks(plan, cluster.order)
    sizes = {**{a: getattr(plan, a) for a in AXES}, "edp": plan.dp // plan.ep}
    return {link for link in LINKS if sizes[link] > 1 and cluster.gpus_per_node % blocks[link]}


def predict_at_scale(shape: GPTShape, plan: Plan, cluster: Cluster) -> dict[str, float | str | bool]:
    """Chapter 10's predict_step of one layout, each link's messages on its own link, and memory_per_rank's largest.

    Keys: compute_s, bubble_s, dp_s ... edp_s, loss_sum_s, step_s (seconds); memory_bytes (the busiest stage's rank);
    fits; across (the links that leave a node, comma-separated)."""
    calibrated = {name: predict_step(shape, plan, Calibration(cluster.flops_per_s, 0.0, plan.ranks, link))
                  for name, link in (("intra", cluster.intra), ("inter", cluster.inter))}
    across = links_across_nodes(plan, cluster)
    out: dict[str, float | str | bool] = {"compute_s": calibrated["intra"]["compute_s"],
                                          "bubble_s": calibrated["intra"]["bubble_s"]}
    for link in LINKS:
        out[f"{link}_s"] = calibrated["inter" if link in across else "intra"][f"{link}_s"]
    # the loss's sum travels on the data and context axes (and the tensor axis with sequence parallelism)
    loss_links = {"dp", "cp"} | ({"tp"} if plan.sequence_parallel else set())
    loss_on = "inter" if loss_links & across else "intra"
    out["loss_sum_s"] = calibrated[loss_on]["loss_sum_s"]
    # predict_step's sum, each link's term from its own link
    out["step_s"] = calibrated["intra"]["step_s"] + sum(
        calibrated["inter"][f"{link}_s"] - calibrated["intra"][f"{link}_s"] for link in across) + (
        calibrated[loss_on]["loss_sum_s"] - calibrated["intra"]["loss_sum_s"])
    memory = max(memory_per_rank(shape, plan, st)["total"] for st in range(plan.pp))
    out.update(memory_bytes=memory, fits=memory <= cluster.memory_gib * GIB, across=",".join(sorted(across)))
    return out


def scale_layouts(shape: GPTShape, n: int, batch: int, microbatch: int = 1,
                  axes: tuple[str, ...] = ("dp", "tp", "pp"), itemsize: int = 2) -> list[ScalePlan]:
    """Every layout of exactly n GPUs over `axes` that splits the shape and the batch evenly: each data replica's
    B/N_dp sequences in microbatches of `microbatch` sequences (m = B/(N_dp b), the pipeline's microbatches, or
    gradient accumulation without one); cp and ep not both, ep only with experts. Mixed precision by default."""
    check_int("n", n, 1, MAX_GPUS)
    sizes = [d for d in range(1, n + 1) if n % d == 0]
    out = []
    for dp, tp, pp, cp in itertools.product(sizes, repeat=4):
        used = {"dp": dp, "tp": tp, "pp": pp, "cp": cp}
        if dp * tp * pp * cp != n or any(v > 1 and a not in axes for a, v in used.items()):
            continue
        if batch % (dp * microbatch):
            continue
        for ep in [d for d in sizes if dp % d == 0] if shape.experts and "ep" in axes else [1]:
            if cp > 1 and ep > 1:
                continue
            try:
                plan = ScalePlan(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, batch=batch,
                                 microbatches=batch // (dp * microbatch), itemsize=itemsize)
                plan.check_shape(shape)
            except ValueError:
                continue
            out.append(plan)
    return out


def rank_at_scale(shape: GPTShape, n: int, batch: int, cluster: Cluster | None = None, microbatch: int = 1,
                  axes: tuple[str, ...] = ("dp", "tp", "pp"), keep_all: bool = False) -> pd.DataFrame:
    """The layouts of n GPUs that fit in memory (every one with keep_all), fastest predicted step first."""
    cluster = cluster or Cluster()
    rows = [{"layout": describe(plan), "gpus": n, **{a: getattr(plan, a) for a in AXES}, "m": plan.microbatches,
             **predict_at_scale(shape, plan, cluster)}
            for plan in scale_layouts(shape, n, batch, microbatch, axes)]
    frame = pd.DataFrame(rows)
    if len(frame) and not keep_all:
        frame = frame[frame.fits]
    if len(frame):
        frame = frame.sort_values(["fits", "step_s"], ascending=[False, True]).reset_index(drop=True)
        frame["memory_gib"] = frame.memory_bytes / GIB
        frame["tokens_per_s"] = batch * shape.seq_len / frame.step_s
    return frame


def best_layouts(model: str = "GPT-3 175B", gpus: tuple[int, ...] = (64, 128, 256, 512, 1024, 2048, 4096),
                 cluster: Cluster | None = None, **kw: object) -> pd.DataFrame:
    """For each N, the fastest layout of GPT3[model] that fits (no row where none fits), with Ψ and the model."""
    shape, batch = GPT3[model]
    rows = []
    for n in gpus:
        ranked = rank_at_scale(shape, n, batch, cluster, **kw)  # type: ignore[arg-type]
        if len(ranked):
            rows.append(ranked.iloc[0].to_dict() | {"model": model, "params": param_count(shape),
                                                    "fitting_layouts": len(ranked)})
    return pd.DataFrame(rows)


def ideal_step_s(model: str, n: int, cluster: Cluster | None = None) -> float:
    """The compute alone of GPT3[model]'s step on n GPUs (no bubble, no messages): the floor every layout sits on."""
    shape, batch = GPT3[model]
    return flops_per_step(shape, batch) / n / (cluster or Cluster()).flops_per_s

