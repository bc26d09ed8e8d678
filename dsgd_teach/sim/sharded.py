"""One data-parallel training step of a large transformer at scale, per ZeRO stage, for N up to 1024 GPUs.

Memory and traffic per GPU are chapter 09's accounting (`sharded.fit`, `sharded.zero.traffic_formula`:
Rajbhandari et al. 2020, section 5, for the model states and section 3.2 for the temporary buffers, one unit's
gradient and the gathered units; Korthikanti et al. 2022, eq. 1, for the activations, 2sbh per layer under full
checkpointing as in their section 5 and Table 2, with the layer that backward rebuilds), called here, not copied. The step's time is compute plus communication. Compute is 6Ψ FLOPs per token (Kaplan et al. 2020,
section 2.1, whose N is our Ψ): 2Ψ forward, 4Ψ backward, and 2Ψ more in the backward pass when every layer is
recomputed (full checkpointing: 8Ψ), at an achievable FLOP/s. Communication runs the simulator's α–β link
(AlphaBetaNet) over chapter 05's ring schedule, Ψ elements of the gradient's precision, one ring phase (N-1 steps)
per collective. When each collective runs decides what overlap can hide:
* ZeRO-0 (DDP) allreduces the gradients bucket by bucket during backward: both phases hide behind backward;
* ZeRO-1 and 2 reduce-scatter the gradients during backward, then each rank updates its shard, and only after that
  optimizer step are the new parameters all-gathered (Rajbhandari et al. 2020, sections 5.1-5.2 and 7.2.1): that
  gather cannot hide behind this step's backward; at best it runs unit by unit under the next forward, like
  stage 3's;
* ZeRO-3 all-gathers each unit before its forward (under the forward) and again before its backward, and
  reduce-scatters the gradients (both under the backward; section 7.2.2).
Without overlap the step is the sum of all; with overlap each pass takes the longer of its compute and the
traffic that runs under it. One collective per phase over the whole model: bucketing by layer adds only latency
terms.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pandas as pd

from ..collectives.cost_model import schedule_steps
from ..config import Config, check_bool, check_choice, check_float, check_int
from ..sharded.fit import BYTES, GIB, Model, activations, buffer_bytes, model_states, rebuilt_layer
from ..sharded.zero import traffic_formula
from .network import AlphaBetaNet

MAX_GPUS = 1024
#: Decoder-only transformers by name: shape (layers, hidden, heads, vocab) and where it is stated. Ψ is fit.py's
#: 12 L h^2 + V h count; for Llama 2 70B that is 64.7e9, below its 69e9, because its SwiGLU MLP (28672 wide) and
#: grouped-query attention (8 key-value heads) are not the 4h MLP and full attention the count assumes.
TRANSFORMERS: dict[str, tuple[Model, str]] = {
    "1.3B": (Model(24, 2048, 24), "GPT-3 XL (Brown et al. 2020, Table 2.1)"),
    "7B": (Model(32, 4096, 32, vocab=32_000), "LLaMA 7B (Touvron et al. 2023a, Table 2)"),
    "13B": (Model(40, 5120, 40, vocab=32_000), "LLaMA 13B (Touvron et al. 2023a, Table 2)"),
    "70B": (Model(80, 8192, 64, vocab=32_000),
            "Llama 2 70B: LLaMA 65B's 80 layers, hidden 8192, 64 heads (Touvron et al. 2023a, Table 2), kept with "
            "grouped-query attention added (Touvron et al. 2023b, section 2.2)"),
}


@dataclass(frozen=True)
class ShardedSimConfig(Config):
    """One step of `model` on `workers` GPUs under ZeRO `stage`: microbatch sequences of `seq` tokens per GPU.

    Defaults: an A100 80 GB at 150e12 FLOP/s, about what LLaMA 65B's training reached (380 tokens/s per GPU,
    Touvron et al. 2023a, section 2.4, times 6Ψ), on 200 Gb/s links (bandwidth_Bps = 1/β = 25e9). `params`, if
    set, replaces the model's Ψ in the states and the traffic (activations keep the model's shape).
    """

    model: str = "70B"
    workers: int = 64
    stage: int = 3
    precision: str = "mixed"
    microbatch: int = 1
    seq: int = 4096
    checkpoint: bool = True
    overlap: bool = True
    gpu_gib: float = 80.0
    flop_s: float = 150e12
    alpha_s: float = 5e-6
    bandwidth_Bps: float = 25e9
    params: int | None = None

    def validate(self) -> None:
        check_choice("model", self.model, tuple(TRANSFORMERS))
        check_int("workers", self.workers, 1, MAX_GPUS)
        check_int("stage", self.stage, 0, 3)
        check_choice("precision", self.precision, tuple(BYTES))
        check_int("microbatch", self.microbatch, 1, 4096)
        check_int("seq", self.seq, 1, 1 << 20)
        check_bool("checkpoint", self.checkpoint)
        check_bool("overlap", self.overlap)
        check_float("gpu_gib", self.gpu_gib, 0.0, 1e4, lo_open=True)
        check_float("flop_s", self.flop_s, 0.0, 1e18, lo_open=True)
        check_float("alpha_s", self.alpha_s, 0.0, 1.0)
        check_float("bandwidth_Bps", self.bandwidth_Bps, 0.0, 1e13, lo_open=True)
        if self.params is not None:
            check_int("params", self.params, 1, 10**13)

    @property
    def shape(self) -> Model:
        """The model's shape (fit.Model)."""
        return TRANSFORMERS[self.model][0]

    @property
    def psi(self) -> int:
        """Ψ: the parameters that are stored, reduced and gathered."""
        return self.params if self.params is not None else self.shape.params


def ring_phase_s(net: AlphaBetaNet, n: int, elements: int, itemsize: int) -> float:
    """Seconds of one reduce-scatter (or all-gather) on a ring: the first N-1 of the ring allreduce's 2(N-1) steps."""
    return sum(net.message_s(b) for b in schedule_steps("ring", n, elements, itemsize)[: n - 1])


def phases_under_passes(stage: int) -> tuple[int, int]:
    """(ring phases under the forward pass, under the backward pass) of one step under ZeRO `stage`.

    DDP: (0, 2), the allreduce during backward. ZeRO-1/2: (1, 1), the reduce-scatter during backward, the all-gather
    after the optimizer step (at best under the next forward). ZeRO-3: (1, 2), a gather under the forward, a gather
    and the reduce-scatter under the backward.
    """
    return {0: (0, 2), 1: (1, 1), 2: (1, 1), 3: (1, 2)}[stage]


def simulate_sharded_step(config: ShardedSimConfig) -> dict[str, Any]:
    """One row: memory per GPU and bytes sent (chapter 09's accounting), compute, communication and step seconds."""
    c, psi = config, config.psi
    elem = BYTES[c.precision][1]  # bytes of one gradient or parameter element on the wire
    states, act, rebuilt, buffers = memory_bytes(c)
    total = states + act + rebuilt + buffers
    tokens = c.microbatch * c.seq
    forward_s = 2 * psi * tokens / c.flop_s
    backward_s = (4 + (2 if c.checkpoint else 0)) * psi * tokens / c.flop_s
    phase = ring_phase_s(AlphaBetaNet(c.alpha_s, c.bandwidth_Bps), c.workers, psi, elem)
    # phases of traffic under each pass (see the module's docstring): DDP 0 + 2, ZeRO-1/2 1 + 1, ZeRO-3 1 + 2
    comm_forward, comm_backward = phases_under_passes(c.stage)
    comm_forward, comm_backward = comm_forward * phase, comm_backward * phase
    if c.overlap:
        step_s = max(forward_s, comm_forward) + max(backward_s, comm_backward)
    else:
        step_s = forward_s + backward_s + comm_forward + comm_backward
    compute_s = forward_s + backward_s
    return {
        "model": c.model, "params": psi, "workers": c.workers, "stage": c.stage, "precision": c.precision,
        "microbatch": c.microbatch, "seq": c.seq, "checkpoint": c.checkpoint, "overlap": c.overlap,
        "states_gib": states / GIB, "activations_gib": act / GIB, "rebuilt_gib": rebuilt / GIB,
        "buffers_gib": buffers / GIB, "total_gib": total / GIB, "fits": total <= c.gpu_gib * GIB, "sent_bytes": traffic_formula(psi, c.workers, c.stage) * elem,
        "compute_s": compute_s, "comm_s": comm_forward + comm_backward, "step_s": step_s,
        "exposed_comm_s": step_s - compute_s, "tokens_per_s": c.workers * tokens / step_s,
    }


def run_sharded_sim(configs: Iterable[ShardedSimConfig]) -> pd.DataFrame:
    """A tidy frame, one row per config (simulate_sharded_step of each)."""
    return pd.DataFrame([simulate_sharded_step(c) for c in configs])


def sharded_sweep(model: str = "70B", workers: Iterable[int] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
          stages: Iterable[int] = (0, 1, 2, 3), overlap: Iterable[bool] = (False, True),
          **fields: Any) -> pd.DataFrame:
    """simulate_sharded_step over every (stage, N, overlap), the other fields fixed."""
    return run_sharded_sim(ShardedSimConfig(model=model, workers=n, stage=s, overlap=o, **fields)
                           for s in stages for n in workers for o in overlap)


def memory_bytes(config: ShardedSimConfig) -> tuple[float, float, float, float]:
    """(model states, kept activations, layer rebuilt in backward, ZeRO buffers) in bytes per GPU: fit.py's
    model_states, activations, rebuilt_layer (with checkpointing only) and buffer_bytes."""
    c = config
    return (model_states(c.psi, c.workers, c.stage, c.precision)["total"],
            activations(c.shape, c.microbatch, c.seq, c.checkpoint),
            rebuilt_layer(c.shape, c.microbatch, c.seq) if c.checkpoint else 0.0,
            buffer_bytes(c.shape, c.stage, c.precision))


def fewest_gpus(model: str = "70B", **fields: Any) -> pd.DataFrame:
    """Per ZeRO stage, the smallest N <= 1024 on which one step fits in gpu_gib (<NA> where none does).

    Memory per GPU never grows with N, so a bisection over N finds it.
    """
    rows = []
    for stage in range(4):
        base = ShardedSimConfig(model=model, stage=stage, workers=MAX_GPUS, **fields)
        lo, hi = 1, MAX_GPUS
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if _gib(base, mid) <= base.gpu_gib else (mid + 1, hi)
        n = lo if _gib(base, lo) <= base.gpu_gib else None
        rows.append({"model": model, "stage": stage, "fewest_gpus": n,
                     "gib_per_gpu_there": _gib(base, n) if n else None, "gib_per_gpu_at_1024": _gib(base, MAX_GPUS)})
    return pd.DataFrame(rows).astype({"fewest_gpus": "Int64", "gib_per_gpu_there": "Float64"})


def _gib(config: ShardedSimConfig, n: int) -> float:
    """GiB per GPU of config on n GPUs."""
    return sum(memory_bytes(config.replace(workers=n))) / GIB
