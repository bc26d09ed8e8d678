"""Calibrate on this cluster, then predict a layout's step time and rank the layouts of a model on N ranks.

The machine enters through what the calibration measures: the FLOP/s one rank's matmuls reach (a timing of the
model's own training step at two batch sizes gives the rate and a fixed cost per layer: Python and kernel launches,
which dominate a small model), ring attention's fixed cost per block, the cores the ranks share and how much longer
N busy ranks compute than one, chapter 05's α-β link (a ping-pong between two ranks) and the link N busy ranks meet
in rings of each axis's size (`busy_link.py`). The step time is then, as "How to Scale Your Model" (Part 1, "All About Rooflines"; Part 5 for the parallel terms)
reasons: each rank's share of the FLOPs at the measured rate, stretched by the pipeline's bubble (p-1)/m (Narayanan
et al. 2021, section 2.2), plus each axis's messages under the α-β model, none of it overlapped (on a CPU the ranks'
messages and matmuls share the same cores).
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import torch

from ..collectives.cost_model import AlphaBeta
from .predict import Plan, axis_messages, flops_per_step, memory_per_rank
from .ring_attention import block_pairs, ring_attention

if TYPE_CHECKING:
    from .model import GPTShape


@dataclass(frozen=True)
class Calibration:
    """One rank's matmul rate and per-layer overhead, the cores the ranks share, and the link: the idle ping-pong's
    α and β, and (busy_links) the α and β measured among N busy ranks in rings of a given size, as (N, ring size,
    link); how much
    longer N busy ranks compute than one (shares); and what ring attention's blocks cost beyond plain attention
    (seconds per layer and microbatch, forward and backward)."""

    flops_per_s: float
    overhead_s: float  # seconds per layer and microbatch, forward and backward, beyond the FLOPs
    cores: int
    link: AlphaBeta
    busy_links: tuple[tuple[int, int, AlphaBeta], ...] = ()
    shares: tuple[tuple[int, float], ...] = ()  # (N, how many times longer N busy ranks' matmuls take than alone)
    ring_fixed_s: float = 0.0  # ring attention's own cost per layer and microbatch beyond its blocks and plain attention
    ring_block_s: float = 0.0  # each key/value block ring attention computes, with its merge

    def link_for(self, ranks: int, ring: int | None = None) -> AlphaBeta:
        """The link a step on `ranks` ranks meets in a group of `ring` of them (all of them by default): measured on
        the most ranks not above `ranks` (the fewest when all are above), in the largest ring not above `ring` (the
        smallest when all are above); the idle ping-pong's when none was measured."""
        if not self.busy_links:
            return self.link
        counts = sorted({n for n, _, _ in self.busy_links})
        n = max([c for c in counts if c <= ranks], default=counts[0])
        rings = {g: link for m, g, link in self.busy_links if m == n}
        want = n if ring is None else ring
        g = max([r for r in rings if r <= want], default=min(rings))
        return rings[g]

    def share_for(self, ranks: int) -> float:
        """How many times longer a rank's compute takes when `ranks` ranks compute at once: measured for that many
        (it includes whatever else the machine runs), else N/cores when N ranks share fewer cores, else 1."""
        return dict(self.shares).get(ranks, max(1.0, ranks / self.cores))

    def ring_attention_s(self, plan: Plan) -> float:
        """Seconds ring attention adds per layer and microbatch on the busiest context rank: its fixed cost and
        each block it computes (2 N_cp + 1 when balanced, N_cp on the last rank when not: ring_attention.block_pairs)."""
        if plan.cp == 1:
            return 0.0
        blocks = max(len(block_pairs(r, plan.cp, plan.balanced)) for r in range(plan.cp))
        return self.ring_fixed_s + blocks * self.ring_block_s


def time_step(shape: GPTShape, batch: int, repeats: int = 5, seed: int = 0, threads: int = 1) -> float:
    """Median seconds of one forward + backward + SGD update of the single-process model on `batch` sequences."""
    from .corpus import batch_at, make_corpus
    from .model import build_gpt, lm_loss

    torch.set_num_threads(threads)
    model = build_gpt(shape, seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    corpus = make_corpus(seed, 4 * batch * (shape.seq_len + 1) + 64, shape.vocab)
    x, y = batch_at(corpus, 0, None, batch, shape.seq_len, seed)
    times = []
    for _ in range(repeats + 1):  # the first step warms the allocator up
        t = time.perf_counter()
        opt.zero_grad()
        lm_loss(model(x), y).backward()
        opt.step()
        times.append(time.perf_counter() - t)
    return float(np.median(times[1:]))


def fit_compute(shape: GPTShape, batches: tuple[int, ...] = (2, 8), repeats: int = 5) -> tuple[float, float]:
    """(FLOP/s, overhead per layer) from timing the model at several batch sizes: t = L·overhead + FLOPs / rate."""
    flops = np.array([flops_per_step(shape, b) for b in batches], dtype=float)
    seconds = np.array([time_step(shape, b, repeats) for b in batches])
    slope, intercept = np.polyfit(flops, seconds, 1)
    if slope <= 0:  # noise hid the FLOPs' share: all of it is rate
        return float(flops[-1] / seconds[-1]), 0.0
    return float(1.0 / slope), float(max(intercept, 0.0) / shape.layers)


def saved_bytes(shape: GPTShape, batch: int, seed: int = 0) -> int:
    """Bytes autograd keeps for backward after the single-process model's forward and loss: each storage once
    (q, k and v are views of one tensor; softmax's output is also the next matmul's input), parameters left out."""
    from .corpus import batch_at, make_corpus
    from .model import build_gpt, lm_loss

    model = build_gpt(shape, seed)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            storages[storage.data_ptr()] = storage.nbytes()
        return t

    corpus = make_corpus(seed, 4 * batch * (shape.seq_len + 1) + 64, shape.vocab)
    x, y = batch_at(corpus, 0, None, batch, shape.seq_len, seed)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = lm_loss(model(x), y)
    del loss
    return sum(storages.values())


def matmul_flops(n: int = 512, repeats: int = 5, threads: int = 1) -> float:
    """FLOP/s of an n×n by n×n float32 matmul (2 n³ FLOPs) on `threads` threads: the roofline's compute peak."""
    torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t)
    return 2 * n**3 / float(np.median(times))


def predict_step(shape: GPTShape, plan: Plan, cal: Calibration) -> dict[str, float]:
    """Seconds of one step on each rank's critical path: compute, bubble and each link's messages, and their sum.

    Compute is the step's FLOPs divided over the N ranks at the fitted rate, plus the fixed cost of every layer and
    microbatch a rank runs (and ring attention's blocks with context parallelism), stretched by the share of a core
    each of N busy ranks gets (`Calibration.share_for`: measured; N/cores when N ranks share fewer cores). Messages
    follow the α-β model: a ring allreduce of K fp32 elements on the N_x ranks of axis x takes 2(N_x-1)(α + β 4K/N_x)
    (chapter 05), a point-to-point message of m bytes α + β m, with the α and β measured among as many busy ranks as
    the layout has, in rings as large as the axis (`Calibration.link_for`); each link's messages are the
    busiest stage's (the one sending most in all), plus the messages that sum the step's loss."""
    plan.check_shape(shape)
    n, m = plan.ranks, plan.microbatches
    layers = shape.layers // plan.pp
    share = cal.share_for(n)
    fixed = (cal.overhead_s + cal.ring_attention_s(plan)) * layers * m
    compute = (flops_per_step(shape, plan.batch) / n / cal.flops_per_s + fixed) * share
    bubble = compute * (plan.pp - 1) / m
    sizes = {"dp": plan.dp, "tp": plan.tp, "pp": 2, "cp": plan.cp, "ep": plan.ep, "edp": plan.dp // plan.ep}
    # a collective's message is a send and a receive at once; a pipeline stage sends and receives at different
    # moments (its activations forward, the gradients back), and waits for each: twice the α per message
    comm = {}
    for link, (msgs, elements) in worst_messages(shape, plan).items():
        wire = cal.link_for(n, sizes[link])
        comm[link] = wire.alpha * msgs * (2 if link == "pp" else 1) + wire.beta * elements * plan.itemsize
    # the step's loss, one number, summed over the context and data axes (and the tensor axis with sequence
    # parallelism) by a small allreduce on each: its bytes are nothing, its 2(n-1) messages are not
    loss_axes = (plan.cp, plan.dp) + ((plan.tp,) if plan.sequence_parallel else ())
    loss = sum(cal.link_for(n, k).alpha * 2 * (k - 1) for k in loss_axes if k > 1)
    out = {"compute_s": compute, "bubble_s": bubble, **{f"{k}_s": v for k, v in comm.items()}, "loss_sum_s": loss}
    out["step_s"] = compute + bubble + sum(comm.values()) + loss
    return out


def time_ring_attention(shape: GPTShape, batch: int = 8, repeats: int = 20) -> tuple[float, float]:
    """(fixed, per block) seconds ring attention adds to plain causal attention, forward and backward, on one rank:
    timed at one rank's world with one block (unbalanced) and three (balanced) on the model's [B, a, s, h/a]. A
    block's cost is taken as a fixed cost whatever its size (at a small model's sizes its few matmuls and merge are
    mostly launches): the three balanced blocks hold 3/4 of the one block's scores, so their FLOPs are not charged
    twice."""
    from ..runtime.ranks.comm import Comm
    from .model import causal_attention

    torch.set_num_threads(1)
    comm = Comm(0, 1, torch.device("cpu"), 10.0)
    q, k, v = (torch.randn(batch, shape.heads, shape.seq_len, shape.head_dim, requires_grad=True) for _ in range(3))

    def median_s(attend: Callable[[], torch.Tensor]) -> float:
        times = []
        for _ in range(repeats + 3):
            t = time.perf_counter()
            attend().sum().backward()
            times.append(time.perf_counter() - t)
        return float(np.median(times[3:]))

    plain = median_s(lambda: causal_attention(q, k, v))
    one = median_s(lambda: ring_attention(comm, q, k, v, balanced=False))
    three = median_s(lambda: ring_attention(comm, q, k, v, balanced=True))
    block = max(0.0, (three - one) / 2)
    return max(0.0, one - block - plain), block


def worst_messages(shape: GPTShape, plan: Plan) -> dict[str, tuple[float, float]]:
    """axis_messages of the pipeline stage that sends the most elements in all."""
    per_stage = [axis_messages(shape, plan, st) for st in range(plan.pp)]
    return max(per_stage, key=lambda msgs: sum(e for _, e in msgs.values()))


def layouts(n: int, shape: GPTShape, batch: int, microbatches: int = 1,
            axes: tuple[str, ...] = ("dp", "tp", "pp", "cp", "ep")) -> list[Plan]:
    """Every plan of exactly n ranks whose axes split this shape and batch evenly (cp and ep not both)."""
    sizes = [d for d in range(1, n + 1) if n % d == 0]
    out = []
    for dp, tp, pp, cp in itertools.product(sizes, repeat=4):
        if dp * tp * pp * cp != n or (tp > 1 and "tp" not in axes) or (pp > 1 and "pp" not in axes) or (
                cp > 1 and "cp" not in axes) or (dp > 1 and "dp" not in axes):
            continue
        for ep in [d for d in sizes if dp % d == 0] if shape.experts and "ep" in axes else [1]:
            if cp > 1 and ep > 1:
                continue
            m = microbatches if pp > 1 else 1
            try:
                plan = Plan(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, batch=batch, microbatches=m)
                plan.check_shape(shape)
            except ValueError:
                continue
            out.append(plan)
    return out


def rank_layouts(shape: GPTShape, n: int, batch: int, cal: Calibration, memory_bytes: float = math.inf,
                 microbatches: int = 4) -> pd.DataFrame:
    """Every layout of n ranks for this model and batch, fastest predicted step first, with the largest memory
    any of its ranks holds and whether it fits in memory_bytes."""
    rows = []
    for plan in layouts(n, shape, batch, microbatches):
        step = predict_step(shape, plan, cal)
        memory = max(memory_per_rank(shape, plan, st)["total"] for st in range(plan.pp))
        rows.append({"layout": describe(plan), "dp": plan.dp, "tp": plan.tp, "pp": plan.pp, "cp": plan.cp,
                     "ep": plan.ep, "m": plan.microbatches, **step, "memory_bytes": memory,
                     "fits": memory <= memory_bytes})
    frame = pd.DataFrame(rows)
    if len(frame):
        frame = frame.sort_values(["fits", "step_s"], ascending=[False, True]).reset_index(drop=True)
    return frame


def describe(plan: Plan) -> str:
    """A layout's name, e.g. 'dp2·tp2·pp2' (axes of size 1 left out; 'single' when all are)."""
    parts = [f"{a}{getattr(plan, a)}" for a in ("dp", "tp", "pp", "cp", "ep") if getattr(plan, a) > 1]
    return "·".join(parts) or "single"
