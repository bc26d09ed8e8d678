"""A transformer's parameters, FLOPs and memory traffic: what one step costs before it is split across ranks.

Every count is a formula of the model's shape (V, s, h, a, L, E, top-k: course/NOTATION.md), stated once here;
`predict.py` builds the split layouts' bytes and memory on it (its docstring names the papers each formula is from).
* FLOPs: 6 Ψ per token for the weight matmuls (Kaplan et al. 2020, section 2.1; Hoffmann et al. 2022, Appendix F:
  backward costs twice forward), plus the attention scores and their weighted sum, 12 L s h per token forward and
  backward; with recomputation Narayanan et al. 2021's eq. 3.
* Memory traffic: the bytes every matmul reads and writes, the denominator of the roofline's arithmetic intensity
  ("How to Scale Your Model", Part 1, "All About Rooflines").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .model import GPTShape


# --- parameters -------------------------------------------------------------------------------------------------


def layer_params(shape: GPTShape) -> dict[str, int]:
    """One block's parameters: attention 4h² + 4h, MLP (or each expert) 2 r h² + r h + h, two norms 4h, router hE."""
    h, r = shape.width, shape.mlp_ratio
    mlp = 2 * r * h * h + r * h + h
    return {"attention": 4 * h * h + 4 * h, "norms": 4 * h,
            "mlp": mlp * max(1, shape.experts), "router": h * shape.experts}


def param_count(shape: GPTShape) -> int:
    """Ψ, every parameter of `build_gpt(shape)`: embeddings (V + s) h, L blocks, the final norm 2h and the head V h."""
    h = shape.width
    return (shape.vocab + shape.seq_len) * h + shape.layers * sum(layer_params(shape).values()) + 2 * h + shape.vocab * h


def matmul_params(shape: GPTShape) -> int:
    """Weights one token multiplies through: L (4h² + 2 top-k r h² + h E) + h V (Kaplan's N plus the head)."""
    h, r = shape.width, shape.mlp_ratio
    k = shape.top_k if shape.experts else 1
    return shape.layers * (4 * h * h + 2 * k * r * h * h + h * shape.experts) + h * shape.vocab


# --- FLOPs and memory traffic -------------------------------------------------------------------------------------


def flops_per_token(shape: GPTShape, recompute: bool = False) -> float:
    """Forward and backward FLOPs per token: 6 Ψ_matmul + 12 L s h (Hoffmann et al. 2022, Appendix F).

    Backward is two matmuls per forward one (the input's gradient and the weight's), so 3 passes of 2 FLOPs per
    multiply-add; recompute (activation checkpointing) runs the blocks' forward once more, 4 passes, but not the
    head's (Narayanan et al. 2021, eq. 3)."""
    passes = 4 if recompute else 3
    blocks = 2 * (matmul_params(shape) - shape.width * shape.vocab) + 4 * shape.layers * shape.seq_len * shape.width
    return passes * blocks + 3 * 2 * shape.width * shape.vocab


def flops_per_step(shape: GPTShape, batch: int, recompute: bool = False) -> float:
    """FLOPs of one step on B sequences of s tokens: flops_per_token · B s (6 Ψ per token, forward and backward, Kaplan et al. 2020, section 2.1 after eq. 2.2)."""
    return flops_per_token(shape, recompute) * batch * shape.seq_len


def memory_traffic(shape: GPTShape, batch: int, itemsize: int = 4) -> float:
    """Bytes the step's matmuls read and write: 3 (T d_in + d_in d_out + T d_out) each, for T = B s tokens.

    Forward reads X and W and writes Y; backward reads (dY, W) to write dX and (X, dY) to write dW: three times the
    forward's traffic. Attention's two batched products move 4 s h/a + 2 s² elements per head and sequence forward.
    Elementwise work (norms, GELU, softmax) is left out: these are the matmuls' bytes, the roofline's lower bound."""
    t, h, r = batch * shape.seq_len, shape.width, shape.mlp_ratio
    k = shape.top_k if shape.experts else 1
    mats = [(h, 3 * h), (h, h)] + [(h, r * h), (r * h, h)] * k
    per_layer = sum(t * i + i * o + t * o for i, o in mats) + (shape.experts * h * (1 + t) + t * h if shape.experts else 0)
    per_layer += batch * shape.heads * (4 * shape.seq_len * shape.head_dim + 2 * shape.seq_len**2)
    head = t * h + h * shape.vocab + t * shape.vocab
    return 3 * itemsize * (shape.layers * per_layer + head)


def arithmetic_intensity(shape: GPTShape, batch: int, itemsize: int = 4) -> float:
    """FLOPs per byte moved: above the machine's FLOP/s over bandwidth the step is compute-bound (roofline)."""
    return flops_per_step(shape, batch) / memory_traffic(shape, batch, itemsize)
