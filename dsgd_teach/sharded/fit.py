"""Will it fit? Memory per GPU and traffic per step for a model size, precision, ZeRO stage, N and batch.

Model states follow Rajbhandari et al. 2020 (section 3.1): with mixed-precision Adam 2 bytes of parameters,
2 of gradients and K = 12 of optimizer state (fp32 master, momentum, variance) per parameter; plain fp32 Adam is
4 + 4 + 8. ZeRO divides them by N stage by stage. Activations of a transformer layer follow Korthikanti et al.
2022 (their eq. 1, no tensor parallelism): s b h (34 + 5 a s / h) bytes, or 2 s b h with every layer
checkpointed (their section 5 and Table 2).

Symbols as in Korthikanti et al.: s the sequence length in tokens, b the microbatch in sequences, h the hidden
size, a the attention heads (NOTATION.md lists them). Two more terms decide whether a model fits, and chapter 09
measures both on its own ranks:
* under full checkpointing, backward reruns one layer's forward and holds all of that layer's activations while it
  computes the layer's gradients: s b h (34 + 5 a s / h) bytes on top of the 2 s b h L kept checkpoints
  (`rebuilt_layer`);
* ZeRO's temporary buffers (Rajbhandari et al. 2020, section 3.2, residual memory): from stage 2 on, one unit's
  full gradient waits for its reduce-scatter; stage 3 also holds gathered units of parameters, the one computing
  and the next one prefetched (FSDP wraps a transformer layer per unit; its rate limiter allows two all-gathers in
  flight, Zhao et al. 2023, sections 3.3.2-3.3.3 and 3.4.2), `buffer_bytes`.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 2**30
BYTES = {"mixed": (2, 2, 12), "fp32": (4, 4, 8)}  # params, grads, optimizer per parameter


@dataclass(frozen=True)
class Model:
    """A decoder-only transformer's shape: parameters ~ 12 L h^2, plus embeddings."""

    layers: int
    hidden: int
    heads: int
    vocab: int = 50_257

    @property
    def params(self) -> int:
        """Parameter count: 12 L h^2 in the layers (attention 4h^2, MLP 8h^2) plus the vocab x h embedding."""
        return 12 * self.layers * self.hidden**2 + self.vocab * self.hidden


def model_states(params: float, n: int, stage: int, precision: str = "mixed") -> dict[str, float]:
    """Bytes of parameters, gradients and optimizer state on each of n ranks under ZeRO `stage`."""
    p, g, k = BYTES[precision]
    out = {"params": p * params / (n if stage >= 3 else 1),
           "grads": g * params / (n if stage >= 2 else 1),
           "optimizer": k * params / (n if stage >= 1 else 1)}
    out["total"] = sum(out.values())
    return out


def activations(model: Model, microbatch: int, seq: int, checkpoint: bool) -> float:
    """Activation bytes of the whole model for one microbatch (Korthikanti et al. 2022, eq. 1; 2sbh per layer under
    full recompute, their section 5 and Table 2)."""
    s, b, h, a = seq, microbatch, model.hidden, model.heads
    per_layer = 2 * s * b * h if checkpoint else s * b * h * (34 + 5 * a * s / h)
    return model.layers * per_layer


def rebuilt_layer(model: Model, microbatch: int, seq: int) -> float:
    """Bytes of the one layer that backward rebuilds under full checkpointing: s b h (34 + 5 a s / h) (Korthikanti
    et al. 2022, eq. 1, one layer), held beside the kept checkpoints while that layer's gradients are computed."""
    s, b, h, a = seq, microbatch, model.hidden, model.heads
    return s * b * h * (34 + 5 * a * s / h)


def unit_params(model: Model) -> int:
    """Parameters of one sharding unit, a transformer layer: 12 h^2 (attention 4h^2, MLP 8h^2)."""
    return 12 * model.hidden**2


#: Units of parameters a ZeRO-3 rank holds gathered at once: the one computing and the next one prefetched
#: (FSDP's rate limiter: at most two all-gathers in flight, Zhao et al. 2023, section 3.4.2).
GATHERED_UNITS = 2


def buffer_bytes(model: Model, stage: int, precision: str = "mixed") -> float:
    """ZeRO's temporary buffers per GPU beyond the model states (Rajbhandari et al. 2020, section 3.2).

    Stage 0 and 1 keep the full gradient anyway (counted in the states). From stage 2 on, one unit's full gradient
    waits for its reduce-scatter; stage 3 also holds GATHERED_UNITS units of parameters, all-gathered in full.
    """
    p, g, _ = BYTES[precision]
    unit = unit_params(model)
    return (g * unit if stage >= 2 else 0) + (GATHERED_UNITS * p * unit if stage >= 3 else 0)


def will_it_fit(model: Model, n: int, stage: int, microbatch: int = 1, seq: int = 2048, checkpoint: bool = False,
                precision: str = "mixed", gpu_gib: float = 80.0) -> dict[str, float | bool]:
    """Memory per GPU (GiB): model states, kept activations, the layer rebuilt during backward (with checkpointing)
    and ZeRO's temporary buffers; bytes sent per step, and whether it fits."""
    states = model_states(model.params, n, stage, precision)
    act = activations(model, microbatch, seq, checkpoint)
    rebuilt = rebuilt_layer(model, microbatch, seq) if checkpoint else 0.0
    buffers = buffer_bytes(model, stage, precision)
    elem = BYTES[precision][1]
    sent = (3 if stage == 3 else 2) * model.params * (n - 1) / n * elem
    total = states["total"] + act + rebuilt + buffers
    return {"params": model.params, "states_gib": states["total"] / GIB, "activations_gib": act / GIB,
            "rebuilt_gib": rebuilt / GIB, "buffers_gib": buffers / GIB,
            "total_gib": total / GIB, "sent_gib_per_step": sent / GIB, "fits": total <= gpu_gib * GIB}
