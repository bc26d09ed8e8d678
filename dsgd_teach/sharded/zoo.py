"""Models learners bring to chapter 09, each with what trips a naive DDP or ZeRO: norms, embeddings, tied weights,
frozen layers, a layer forward never uses, and a branch only some batches take.

Every model maps the chapter's 32-wide inputs (`toy.batch`) to 8 outputs and is rebuilt identically from a seed in
any process, so each rank, and each of PyTorch's own implementations, can start from the same weights.
"""

from __future__ import annotations

import torch

KINDS = ("norm_embedding", "tied", "frozen", "unused", "sometimes")


class ZooNet(torch.nn.Module):
    """A small network of one kind (see KINDS); the same weights for the same seed."""

    def __init__(self, kind: str, width: int = 16, seed: int = 0) -> None:
        super().__init__()
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        self.kind = kind
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            self._build(kind, width)

    def _build(self, kind: str, width: int) -> None:
        self.inp = torch.nn.Linear(32, width)
        self.norm = torch.nn.LayerNorm(width)
        self.emb = torch.nn.Embedding(6, width)  # a learned offset per bucket of the first input
        self.mid = torch.nn.Linear(width, width)
        self.again = torch.nn.Linear(width, width)
        if kind == "tied":
            self.again.weight = self.mid.weight  # one parameter, two layers
        if kind == "frozen":
            self.inp.weight.requires_grad_(False)
            self.norm.requires_grad_(False)
        self.out = torch.nn.Linear(width, 8)
        if kind in ("unused", "sometimes"):
            self.spare = torch.nn.Linear(width, 8)  # "unused": never in forward; "sometimes": for some batches

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The network's output for a batch of 32-wide rows."""
        ids = (x[:, 0].abs() * 3).long().clamp(max=5)
        h = torch.tanh(self.norm(self.inp(x)) + self.emb(ids))
        h = torch.tanh(self.again(torch.tanh(self.mid(h))))
        y = self.out(h)
        if self.kind == "sometimes" and float(x[:, 1].mean()) > 0:  # data-dependent: differs between ranks
            y = y + self.spare(h)
        return y


def make(kind: str, width: int = 16, seed: int = 0) -> ZooNet:
    """A ZooNet of `kind` with the weights `seed` gives."""
    return ZooNet(kind, width, seed)
