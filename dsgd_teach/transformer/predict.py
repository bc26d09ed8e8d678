"""Predict before measuring: a transformer step's FLOPs, memory traffic, bytes per mesh axis and memory per rank.

Every count is a formula of the model's shape (V, s, h, a, L, E, top-k: course/NOTATION.md) and the layout's mesh
sizes (N_dp, N_tp, p, N_cp, N_ep), stated once here; the chapter, the ranking widget and the tests call it.
* FLOPs: 6 Ψ per token for the weight matmuls (Kaplan et al. 2020, section 2.1: eq. 2.1 counts the weights, eq.
  2.2 a token's forward FLOPs, Table 1 both; Hoffmann et al. 2022, Appendix F: backward costs twice forward), plus
  the attention scores and their weighted sum, 4 s h per token and layer forward, 12 L s h forward and backward
  (Hoffmann et al. 2022, Appendix F; "How to Scale Your Model", Part 4, "All the Transformer Math You Need to Know").
  With recomputation it is Narayanan et al. 2021's eq. 3, 96 B s L h² (1 + s/(6h) + V/(16 L h)).
* Memory traffic: the bytes every matmul reads and writes, the denominator of the roofline's arithmetic intensity
  ("How to Scale Your Model", Part 1, "All About Rooflines").
* Bytes per axis: ring allreduce 2(N-1)/N of the gradient on the data axis (chapter 05); Megatron's four
  allreduces of b s h per layer on the tensor axis (Shoeybi et al. 2019, section 3; Korthikanti et al. 2022,
  section 4.2.2: sequence parallelism sends the same bytes as all-gathers and reduce-scatters); b s h per microbatch
  across each stage boundary (Narayanan et al. 2021, section 2.2); key/value blocks round the ring on the context
  axis (Liu et al. 2023); all-to-alls of the routed tokens on the expert axis (Lepikhin et al. 2021, section 3).
* Memory per rank: Adam's model states as chapter 09's `zero_formula`, and activations by Korthikanti et al. 2022,
  section 4.1 (eq. 1, s b h (34 + 5 a s / h) bytes per layer in fp16 with dropout) and Table 2 for how tensor and
  sequence parallelism divide them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from ..collectives.algorithms import ring_send_chunk
from ..collectives.layout import chunk_sizes
from ..config import Config, check_bool, check_choice, check_int
from ..sharded.zero_formulas import zero_formula
from .flops import (
    arithmetic_intensity,
    flops_per_step,
    flops_per_token,
    layer_params,
    matmul_params,
    memory_traffic,
    param_count,
)

if TYPE_CHECKING:
    from .model import GPTShape

__all__ = ["AXES", "LINKS", "Plan", "activation_bytes", "arithmetic_intensity", "axis_bytes", "axis_elements",
           "axis_messages", "flops_per_step", "flops_per_token", "in_flight", "layer_activations", "layer_params",
           "matmul_params", "memory_per_rank", "memory_traffic", "model_state_bytes", "param_count",
           "replicated_params", "ring_allreduce", "stage_params"]
AXES = ("dp", "tp", "pp", "cp", "ep")
#: Where bytes travel: the axes, and "edp", the ranks holding the same experts (their gradients' allreduce).
LINKS = (*AXES, "edp")


@dataclass(frozen=True)
class Plan(Config):
    """A layout's mesh sizes and the step's batch: B sequences, cut into m microbatches per data replica."""

    dp: int = 1  # N_dp: replicas of the model that see different sequences
    tp: int = 1  # N_tp: ranks that split each layer's heads and MLP columns (Megatron)
    pp: int = 1  # p: pipeline stages, L/p layers each
    cp: int = 1  # N_cp: ranks that split each sequence (ring attention)
    ep: int = 1  # N_ep: data-parallel ranks that share out the experts (it divides N_dp; mesh.Layout's rule)
    batch: int = 8  # B: sequences per step, all ranks together
    microbatches: int = 1  # m: microbatches per data replica per step (the pipeline's)
    sequence_parallel: bool = False  # Korthikanti et al.'s SP on the tensor axis (same bytes, less memory)
    balanced: bool = True  # ring attention with two mirrored chunks per rank (causal load balancing)
    optimizer: str = "adam"
    itemsize: int = 4  # bytes per element: fp32

    #: The largest axis, rank count, batch and microbatch count a plan may have (the simulator's plans allow more).
    max_axis: ClassVar[int] = 64
    max_ranks: ClassVar[int] = 1 << 24
    max_batch: ClassVar[int] = 1 << 20
    max_microbatches: ClassVar[int] = 1024

    def validate(self) -> None:
        for axis in AXES:
            check_int(axis, getattr(self, axis), 1, self.max_axis)
        if self.ranks > self.max_ranks:
            raise ValueError(f"dp·tp·pp·cp must be at most {self.max_ranks} ranks, got {self.ranks}")
        if self.dp % self.ep:
            raise ValueError(f"ep must divide dp (expert parallelism uses the data-parallel ranks), got ep={self.ep}, "
                             f"dp={self.dp}")
        check_int("batch", self.batch, 1, self.max_batch)
        check_int("microbatches", self.microbatches, 1, self.max_microbatches)
        if self.batch % (self.dp * self.microbatches):
            raise ValueError(f"batch must be a multiple of dp·microbatches = {self.dp * self.microbatches}, "
                             f"got batch={self.batch}")
        check_bool("sequence_parallel", self.sequence_parallel)
        check_bool("balanced", self.balanced)
        check_choice("optimizer", self.optimizer, ("adam", "sgd"))
        check_choice("itemsize", self.itemsize, (2, 4))

    @property
    def ranks(self) -> int:
        """N = N_dp · N_tp · p · N_cp (the N_ep expert ranks are data-parallel ranks)."""
        return self.dp * self.tp * self.pp * self.cp

    @property
    def micro_rows(self) -> int:
        """b: sequences in one microbatch of one data replica, B / (N_dp m)."""
        return self.batch // (self.dp * self.microbatches)

    def check_shape(self, shape: GPTShape) -> None:
        """ValueError unless the shape splits evenly over this layout (heads, layers, sequence, experts)."""
        if shape.heads % self.tp or shape.hidden % self.tp:
            raise ValueError(f"tp={self.tp} must divide heads={shape.heads} and the MLP's {shape.hidden} columns")
        if shape.layers % self.pp:
            raise ValueError(f"pp={self.pp} must divide layers={shape.layers}")
        chunks = 2 * self.cp if self.balanced and self.cp > 1 else self.cp
        if shape.seq_len % chunks:
            raise ValueError(f"seq_len={shape.seq_len} must split into {chunks} equal chunks for cp={self.cp}")
        if self.ep > 1 and (shape.experts == 0 or shape.experts % self.ep):
            raise ValueError(f"ep={self.ep} must divide experts={shape.experts} (and experts > 0)")


# --- bytes per mesh axis ------------------------------------------------------------------------------------------


def stage_params(shape: GPTShape, plan: Plan, stage: int, experts_only: bool = False) -> int:
    """Parameters one rank of pipeline stage `stage` holds: its L/p blocks split by tensor (and expert) parallelism.

    Megatron splits qkv and fc by columns (weights and biases), proj by rows (weights; their biases stay whole), and
    keeps the norms whole (Shoeybi et al. 2019, section 3); the E experts are divided over N_ep ranks (each whole on
    every tensor rank: only attention is split in a block with experts), the router (h E, no bias) is whole. The first stage holds the embeddings, the last the final norm and the head. With
    experts_only, only the experts' parameters (averaged over the N_dp/N_ep ranks that hold the same experts)."""
    h, r, t = shape.width, shape.mlp_ratio, plan.tp
    check_int("stage", stage, 0, plan.pp - 1)
    mlp = (2 * r * h * h + r * h) // t + h
    expert_block = (2 * r * h * h + r * h + h) * shape.experts // plan.ep  # experts stay whole on tensor ranks
    if experts_only:
        return shape.layers // plan.pp * expert_block
    attention = (3 * h * h + 3 * h + h * h) // t + h
    block = attention + (expert_block + h * shape.experts if shape.experts else mlp) + 4 * h
    total = shape.layers // plan.pp * block
    if stage == 0:
        total += (shape.vocab + shape.seq_len) * h
    if stage == plan.pp - 1:
        total += 2 * h + shape.vocab * h
    return total


def replicated_params(shape: GPTShape, plan: Plan, stage: int) -> int:
    """Parameters every tensor rank of stage `stage` holds whole: norms, the row-split layers' biases, embeddings,
    final norm and head (with experts, the experts and the router too)."""
    h = shape.width
    per_block = 4 * h + h + (h if not shape.experts else 0)
    total = shape.layers // plan.pp * per_block + stage_params(shape, plan, stage, experts_only=True)
    if shape.experts:
        total += shape.layers // plan.pp * h * shape.experts
    if stage == 0:
        total += (shape.vocab + shape.seq_len) * h
    if stage == plan.pp - 1:
        total += 2 * h + shape.vocab * h
    return total


def ring_allreduce(n: int, k: float, position: int | None = None) -> tuple[float, float]:
    """(messages, elements) one rank sends in a ring allreduce of k elements on n ranks: 2(n-1) messages of k/n,
    2 (n-1)/n k elements (chapter 05). With the rank's position in the ring, exactly what chapter 05's ring sends
    when n does not divide k (chunks of k // n, the first k % n one longer; empty chunks are not sent)."""
    if n <= 1 or k <= 0:
        return (0, 0.0)
    if position is None:
        return (2 * (n - 1), 2 * (n - 1) / n * k)
    sizes = chunk_sizes(int(k), n)
    sent = [sizes[ring_send_chunk(position, n, phase, t)] for phase in ("reduce-scatter", "all-gather")
            for t in range(n - 1)]
    return (sum(1 for c in sent if c), float(sum(sent)))


def axis_messages(shape: GPTShape, plan: Plan, stage: int = 0,
                  coords: dict[str, int] | None = None) -> dict[str, tuple[float, float]]:
    """(messages, elements) one rank of pipeline stage `stage` sends per step on each link ("How to Scale Your
    Model", Part 5, "How to Parallelize a Transformer for Training", does the same accounting for TPU meshes).

    dp: the gradient allreduce, 2 (N_dp-1)/N_dp of the rank's dense parameters (edp: of its experts', over the
    N_dp/N_ep ranks holding the same experts). tp: 4 allreduces of b s h per layer and microbatch, 2 forward and 2
    backward (Shoeybi et al. 2019, section 3, operators f and g); with sequence parallelism each becomes an
    all-gather and a reduce-scatter of the same bytes (Korthikanti et al. 2022, section 4.2.2). pp: one b s h
    activation forward and one gradient back per microbatch and boundary (Narayanan et al. 2021, section 2.2). cp:
    each layer passes the rank's key and value blocks of b (s/N_cp) h/N_tp N_cp - 1 hops round the ring forward; in
    backward the blocks again with their gradients, and a last hop takes the gradients home (Liu et al. 2023,
    section 3): (6 (N_cp - 1) + 2) blocks; and the gradients of the weights every context rank holds, summed by a
    ring allreduce over the N_cp ranks. ep: per MoE layer a dispatch and a combine
    all-to-all forward and both again backward, each sending (N_ep-1)/N_ep of the rank's top-k·b·s routed rows of h
    when routing is uniform (Lepikhin et al. 2021, section 3), and first the E/N_ep int64 row counts to each other
    rank: an expectation, since the rows routed are the data's (`expert_parallel.expert_parallel_bytes` counts a
    run's exactly from the rows it routed). With sequence parallelism the weights every tensor
    rank holds whole (norms, the row-split layers' biases, embeddings and head) saw only 1/N_tp of the tokens: their
    gradients are summed by one more allreduce on the tensor axis, and a stage passes on b s h / N_tp.

    `coords` (the rank's index on each axis, mesh.Layout.coords) makes each ring allreduce exact for that rank."""
    plan.check_shape(shape)
    m, b, h = plan.microbatches, plan.micro_rows, shape.width
    s = shape.seq_len // plan.cp
    layers = shape.layers // plan.pp
    at = coords or {}
    out = dict.fromkeys(LINKS, (0, 0.0))
    experts = stage_params(shape, plan, stage, experts_only=True) if plan.ep > 1 else 0
    out["dp"] = ring_allreduce(plan.dp, stage_params(shape, plan, stage) - experts, at.get("dp"))
    out["edp"] = ring_allreduce(plan.dp // plan.ep, experts, at.get("edp"))
    per_layer = 2 if shape.experts else 4  # a block with experts splits only its attention
    msgs, elems = ring_allreduce(plan.tp, b * s * h)
    extra = ring_allreduce(plan.tp, replicated_params(shape, plan, stage), at.get("tp")) \
        if plan.sequence_parallel else (0, 0.0)
    out["tp"] = (per_layer * layers * m * msgs + extra[0], per_layer * layers * m * elems + extra[1])
    boundaries = (stage > 0) + (stage < plan.pp - 1)
    tokens = s // plan.tp if plan.sequence_parallel else s
    out["pp"] = (boundaries * m, boundaries * m * b * tokens * h)
    if plan.cp > 1:  # forward: N_cp - 1 hops of (k, v); backward: N_cp - 1 hops of (k, v, dk, dv), a last of (dk, dv)
        block = b * s * h // plan.tp
        grads = ring_allreduce(plan.cp, stage_params(shape, plan, stage), at.get("cp"))
        out["cp"] = (layers * m * (2 * plan.cp - 1) + grads[0],
                     layers * m * (6 * (plan.cp - 1) + 2) * block + grads[1])
    if shape.experts and plan.ep > 1:
        rows = min(shape.top_k * b * s, shape.experts * math.ceil(shape.capacity_factor * b * s * shape.top_k
                                                                   / shape.experts))
        calls = 4 * layers * m
        counts = layers * m * (plan.ep - 1) * (shape.experts // plan.ep) * 8 / plan.itemsize  # int64 row counts
        out["ep"] = (calls * (plan.ep - 1) + layers * m * (plan.ep - 1),
                     calls * (plan.ep - 1) / plan.ep * rows * h + counts)
    return out


def axis_elements(shape: GPTShape, plan: Plan, stage: int = 0, coords: dict[str, int] | None = None) -> dict[str, float]:
    """Elements one rank of stage `stage` sends per step on each link (axis_messages' second numbers)."""
    return {link: elements for link, (_, elements) in axis_messages(shape, plan, stage, coords).items()}


def axis_bytes(shape: GPTShape, plan: Plan, stage: int = 0, coords: dict[str, int] | None = None) -> dict[str, float]:
    """Bytes one rank of stage `stage` sends per step on each axis: axis_elements times the element size."""
    return {axis: n * plan.itemsize for axis, n in axis_elements(shape, plan, stage, coords).items()}


# --- memory per rank ----------------------------------------------------------------------------------------------


def layer_activations(s: int, b: int, h: int, a: int, tp: int = 1, sequence_parallel: bool = False,
                      itemsize: int = 2, dropout: bool = True, mlp_ratio: int = 4) -> float:
    """Bytes one layer saves for backward (Korthikanti et al. 2022, section 4.1 and Table 2).

    With e bytes per element: the two norms' inputs, the qkv and fc inputs (4 e s b h) and the two dropout masks
    (2 s b h) are not split by tensor parallelism, only by sequence parallelism; q, k, v, the projection's input
    and the MLP's GELU input and output ((4 + 2 r) e s b h for an MLP r h wide, Korthikanti's 12 e s b h at r = 4)
    and the scores a s² b (e bytes of softmax output, a 1-byte mask and e bytes of its dropout) are divided by
    N_tp. For e = 2 with dropout and N_tp = 1 it is eq. 1, s b h (34 + 5 a s / h); with tensor parallelism
    s b h (10 + 24/t + 5 a s/(h t)), with sequence parallelism all of it over t."""
    e, d = itemsize, int(dropout)
    whole = s * b * h * (4 * e + 2 * d)
    split = (4 + 2 * mlp_ratio) * e * s * b * h + a * s * s * b * (e + d * (1 + e))
    return whole / (tp if sequence_parallel else 1) + split / tp


def model_state_bytes(params: float, optimizer: str = "adam", itemsize: int = 4) -> dict[str, float]:
    """Parameters, gradients and optimizer state of `params` elements: fp32 Adam 4Ψ + 4Ψ + 8Ψ (chapter 09's
    zero_formula, stage 0); SGD without momentum keeps no optimizer state."""
    states = zero_formula(params, 1, 0, mixed=itemsize == 2)
    if optimizer == "sgd":
        states = {**states, "optimizer": 0.0, "total": states["params"] + states["grads"]}
    return states


def in_flight(plan: Plan, stage: int, schedule: str = "1f1b") -> int:
    """Microbatches whose activations stage `stage` holds at once: m for GPipe; min(m, p - stage) for 1F1B
    (Narayanan et al. 2021, section 2.2; the first stage holds p, Korthikanti et al. 2022, section 4.2.3)."""
    check_choice("schedule", schedule, ("1f1b", "gpipe"))
    return plan.microbatches if schedule == "gpipe" else min(plan.microbatches, plan.pp - stage)


def activation_bytes(shape: GPTShape, plan: Plan, stage: int = 0, schedule: str = "1f1b") -> float:
    """Activations one rank of stage `stage` holds at its peak: L/p layers (layer_activations in fp32 without
    dropout, on its s/N_cp tokens) for each microbatch in flight, plus, on the last stage, the final norm's and the
    head's inputs (2 s b h) and the log-softmax's output (s b V) that the loss keeps. A mixture of experts keeps,
    in place of the MLP's 2 r s b h, (3 + 2r) h for each kept assignment (at most top-k of each token's, and
    E times the capacity): the gathered row, the GELU's input and output, the expert's output and its gated copy
    (measured: within 2 % of what autograd keeps)."""
    b, s, e = plan.micro_rows, shape.seq_len // plan.cp, plan.itemsize
    per_layer = layer_activations(s, b, shape.width, shape.heads, plan.tp, plan.sequence_parallel, e, dropout=False,
                                  mlp_ratio=shape.mlp_ratio)
    if shape.experts:  # each kept assignment: its gathered row, GELU input and output, expert output and its copy
        tokens = b * s
        kept = min(shape.top_k * tokens, shape.experts * math.ceil(shape.capacity_factor * tokens * shape.top_k
                                                                    / shape.experts))
        r = shape.mlp_ratio
        per_layer += e * shape.width * (kept * (3 + 2 * r) - tokens * 2 * r / plan.tp)
    held = shape.layers // plan.pp * per_layer
    if stage == plan.pp - 1:
        held += e * s * b * (2 * shape.width + shape.vocab)
    return in_flight(plan, stage, schedule) * held


def memory_per_rank(shape: GPTShape, plan: Plan, stage: int = 0, schedule: str = "1f1b") -> dict[str, float]:
    """Bytes one rank of stage `stage` holds: its parameters, gradients, optimizer state and activations."""
    states = model_state_bytes(stage_params(shape, plan, stage), plan.optimizer, plan.itemsize)
    act = activation_bytes(shape, plan, stage, schedule)
    return {**{k: v for k, v in states.items() if k != "total"}, "activations": act, "total": states["total"] + act}
