"""A small decoder-only transformer (GPT) written plainly: the single-process oracle of every parallel strategy.

Tokens [B, s] -> token + position embeddings [B, s, h] -> L pre-norm blocks (x + attn(ln1(x)), x + mlp(ln2(x)))
-> final layer norm -> LM head -> logits [B, s, V]. Symbols as in course/NOTATION.md: V vocab, s sequence length,
h width, a heads (each of h/a features), L layers. Dropout is 0, so every run is deterministic.

Attention's `qkv` output is laid out head by head (head i owns columns [3i·h/a, 3(i+1)·h/a): its q, k, v), as
Megatron-LM stores it, so that a contiguous split of those columns over N_tp ranks gives each rank whole heads
(Shoeybi et al. 2019, section 3); `forward` infers the number of heads from the tensor it is given, so the same
code runs on a rank's shard.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..config import Config, check_float, check_int, check_seed
from .experts import MoE

Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class GPTShape(Config):
    """A transformer's sizes: V vocab, s sequence length, h width, a heads, L layers, E experts (0: dense MLP)."""

    vocab: int = 64
    seq_len: int = 32
    width: int = 64
    heads: int = 4
    layers: int = 2
    mlp_ratio: int = 4
    experts: int = 0
    top_k: int = 1
    capacity_factor: float = 1.25

    def validate(self) -> None:
        check_int("vocab", self.vocab, 2, 65_536)
        check_int("seq_len", self.seq_len, 1, 8192)
        check_int("width", self.width, 1, 8192)
        check_int("heads", self.heads, 1, self.width)
        if self.width % self.heads:
            raise ValueError(f"heads must divide width={self.width} (each head has width/heads features), "
                             f"got heads={self.heads}")
        check_int("layers", self.layers, 1, 128)
        check_int("mlp_ratio", self.mlp_ratio, 1, 16)
        check_int("experts", self.experts, 0, 256)
        check_int("top_k", self.top_k, 1, max(1, self.experts))
        check_float("capacity_factor", self.capacity_factor, 0.0, 64.0, lo_open=True)

    @property
    def head_dim(self) -> int:
        """Features per head, h/a."""
        return self.width // self.heads

    @property
    def hidden(self) -> int:
        """The MLP's hidden size, mlp_ratio·h."""
        return self.mlp_ratio * self.width


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q kᵀ/√(h/a) + causal mask) v on [B, a, s, h/a] tensors: position i attends to positions ≤ i."""
    s_q, s_k = q.shape[-2], k.shape[-2]
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    future = torch.ones(s_q, s_k, dtype=torch.bool, device=q.device).triu(1)
    scores = scores.masked_fill(future, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


class Attention(nn.Module):
    """Causal multi-head self-attention: qkv = Linear(h, 3h) (head by head), proj = Linear(h, h)."""

    def __init__(self, shape: GPTShape) -> None:
        super().__init__()
        self.head_dim = shape.head_dim
        self.qkv = nn.Linear(shape.width, 3 * shape.width)
        self.proj = nn.Linear(shape.width, shape.width)

    def split_heads(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """[B, s, 3·a'·h/a] -> q, k, v of [B, a', s, h/a], for however many heads a' the columns hold."""
        b, s, _ = qkv.shape
        per_head = qkv.view(b, s, -1, 3, self.head_dim).permute(3, 0, 2, 1, 4)
        return per_head[0], per_head[1], per_head[2]

    def forward(self, x: torch.Tensor, attend: Attend = causal_attention) -> torch.Tensor:
        q, k, v = self.split_heads(self.qkv(x))
        out = attend(q, k, v)  # [B, a', s, h/a]
        b, _, s, _ = out.shape
        return self.proj(out.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    """fc = Linear(h, mlp_ratio·h), GELU, proj = Linear(mlp_ratio·h, h)."""

    def __init__(self, shape: GPTShape) -> None:
        super().__init__()
        self.fc = nn.Linear(shape.width, shape.hidden)
        self.proj = nn.Linear(shape.hidden, shape.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    """A pre-norm transformer block: x + attn(ln1(x)), then x + mlp(ln2(x))."""

    def __init__(self, shape: GPTShape) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(shape.width)
        self.attn = Attention(shape)
        self.ln2 = nn.LayerNorm(shape.width)
        self.mlp: nn.Module = MoE(shape) if shape.experts > 0 else MLP(shape)

    def forward(self, x: torch.Tensor, attend: Attend = causal_attention) -> torch.Tensor:
        x = x + self.attn(self.ln1(x), attend=attend)
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """tok_emb + pos_emb, L blocks, ln_f, head: tokens [B, s] -> logits [B, s, V]."""

    def __init__(self, shape: GPTShape) -> None:
        super().__init__()
        self.shape = shape
        self.tok_emb = nn.Embedding(shape.vocab, shape.width)
        self.pos_emb = nn.Embedding(shape.seq_len, shape.width)
        self.blocks = nn.ModuleList(Block(shape) for _ in range(shape.layers))
        self.ln_f = nn.LayerNorm(shape.width)
        self.head = nn.Linear(shape.width, shape.vocab, bias=False)

    def embed(self, tokens: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Token plus position embeddings, [B, s] -> [B, s, h]; `positions` (default 0..s-1) for a sequence shard."""
        if positions is None:
            positions = torch.arange(tokens.shape[-1], device=tokens.device)
        return self.tok_emb(tokens) + self.pos_emb(positions)

    def forward(
        self, tokens: torch.Tensor, attend: Attend = causal_attention, positions: torch.Tensor | None = None
    ) -> torch.Tensor:
        x = self.embed(tokens, positions)
        for block in self.blocks:
            x = block(x, attend=attend)
        return self.head(self.ln_f(x))


def init_weights(model: nn.Module, generator: torch.Generator) -> None:
    """GPT-2's initialisation, drawn from `generator`: linear and embedding weights N(0, 0.02²), biases 0, layer
    norms (1, 0)."""
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02, generator=generator)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
        if isinstance(module, nn.LayerNorm):
            module.reset_parameters()


#: build_gpt's constructors draw (and discard) from torch's global RNG; one thread at a time forks it.
_BUILD_LOCK = threading.Lock()


def build_gpt(shape: GPTShape, seed: int) -> GPT:
    """A fresh GPT; the same (shape, seed) gives the same weights in any process or thread (the weights come from a
    generator of its own, and torch's global RNG is left as it was)."""
    if not isinstance(shape, GPTShape):
        raise ValueError(f"shape must be a GPTShape, got {type(shape).__name__}")
    check_seed(seed)
    with _BUILD_LOCK, torch.random.fork_rng(devices=[]):
        model = GPT(shape)
    init_weights(model, torch.Generator().manual_seed(seed))
    return model


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of next-token prediction over the B·s tokens."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def count_params(model: nn.Module) -> int:
    """Number of scalar parameters."""
    return sum(p.numel() for p in model.parameters())
