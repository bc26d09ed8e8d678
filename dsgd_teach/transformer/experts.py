"""A mixture-of-experts MLP: a router sends each token to its top-k experts, each expert takes at most `capacity`.

For a token x (a row of h features) the router gives p(x) = softmax(W_r x) over the E experts (Shazeer et al. 2017,
"Outrageously Large Neural Networks: The Sparsely-Gated Mixture-of-Experts Layer", section 2.1). The token goes to
its top-k experts; with top-k = 1 its output is p_i(x)·expert_i(x) (Fedus et al. 2022, "Switch Transformers",
JMLR 23, section 2.1, eq. 1-2), with top-k > 1 the k chosen probabilities are renormalised to sum to 1 first (as
GShard's top-2 gating does: Lepikhin et al. 2021, "GShard", ICLR, Algorithm 1).

Capacity (Switch section 2.2, eq. 3, with top-k choices per token): each expert takes at most
capacity = ceil(C · tokens · top-k / E) tokens of a group. First choices claim slots before second choices (GShard,
Algorithm 1), and within a choice tokens queue in order; an assignment past its expert's capacity is dropped: it
contributes nothing, and a token all of whose choices are dropped leaves the layer as zero, so the block's residual
carries it through unchanged (Switch section 2.2).

The load-balancing loss (Switch section 2.2, eq. 4-6): aux = E · sum_i f_i · P_i, where f_i is the fraction of the
group's tokens whose first choice is expert i and P_i the mean router probability of expert i; it is 1 when routing
is uniform. Switch multiplies it by alpha = 1e-2 before adding it to the loss; `aux_loss` here is without alpha.

Tokens are routed in `groups` equal groups, each with its own capacity and aux loss (GShard section 2.2, local group dispatching;
the aux loss is the mean over groups): expert parallelism routes each rank's tokens as one group, so the
single-process layer with groups = N_ep is its oracle.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn


class MoEShape(Protocol):
    """The fields of a GPTShape that a mixture of experts reads."""

    width: int
    hidden: int
    experts: int
    top_k: int
    capacity_factor: float


def expert_capacity(tokens: int, experts: int, top_k: int, capacity_factor: float) -> int:
    """ceil(C · tokens · top-k / E): the most assignments one expert takes from a group of `tokens` tokens."""
    return math.ceil(capacity_factor * tokens * top_k / experts)


@dataclass
class Routing:
    """Where each of T tokens goes: its top-k experts, gates, slot in each expert's queue, and which slots fit."""

    expert: torch.Tensor  # [T, k] long: the chosen experts, best first
    gate: torch.Tensor  # [T, k]: each choice's weight (differentiable)
    slot: torch.Tensor  # [T, k] long: position in its expert's queue within the token's group
    keep: torch.Tensor  # [T, k] bool: slot < capacity
    capacity: int  # per expert per group
    aux_loss: torch.Tensor  # scalar: E · sum_i f_i P_i, mean over groups

    def stats(self, experts: int) -> dict[str, Any]:
        """Tokens routed to and kept by each expert, assignments dropped, tokens dropped by every choice."""
        routed = torch.bincount(self.expert.reshape(-1), minlength=experts)
        kept = torch.bincount(self.expert[self.keep], minlength=experts)
        return {"tokens_per_expert": routed.tolist(), "kept_per_expert": kept.tolist(),
                "dropped": int((routed - kept).sum()), "dropped_tokens": int((~self.keep.any(dim=1)).sum()),
                "capacity": self.capacity}


def route(logits: torch.Tensor, top_k: int, capacity_factor: float, groups: int = 1) -> Routing:
    """Top-k routing with capacity of T tokens' router logits [T, E], in `groups` equal groups of tokens."""
    tokens, experts = logits.shape
    if not 1 <= top_k <= experts:
        raise ValueError(f"top_k must be in [1, {experts}] (the number of experts), got {top_k}")
    if groups < 1 or tokens % groups:
        raise ValueError(f"groups must be >= 1 and divide the {tokens} tokens, got {groups}")
    per_group = tokens // groups
    probs = torch.softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)  # bf16 up, f64 kept
    top_p, expert = probs.topk(top_k, dim=-1)
    gate = top_p if top_k == 1 else top_p / top_p.sum(dim=-1, keepdim=True)
    capacity = expert_capacity(per_group, experts, top_k, capacity_factor)
    # Queue order inside a group: every token's first choice, then every token's second choice, ...
    chosen = F.one_hot(expert.view(groups, per_group, top_k).transpose(1, 2), experts)  # [G, k, T/G, E]
    queue = chosen.reshape(groups, top_k * per_group, experts).cumsum(dim=1) - 1
    slot = (queue * chosen.reshape(groups, top_k * per_group, experts)).sum(dim=-1)  # [G, k·T/G]
    slot = slot.view(groups, top_k, per_group).transpose(1, 2).reshape(tokens, top_k)
    aux = load_balancing_loss(probs, expert[:, 0], groups)
    return Routing(expert, gate.to(logits.dtype), slot, slot < capacity, capacity, aux)


def load_balancing_loss(probs: torch.Tensor, first_choice: torch.Tensor, groups: int = 1) -> torch.Tensor:
    """Switch Transformer's auxiliary loss E Σ_i f_i P_i (Fedus et al. 2022, section 2.2, eq. 4-6), averaged over
    the groups: f_i the fraction of a group's tokens whose first choice is expert i, P_i their mean router
    probability for expert i; 1 when routing is uniform, larger the more it favours some experts."""
    tokens, experts = probs.shape
    first = F.one_hot(first_choice, experts).float().view(groups, tokens // groups, experts)
    f = first.mean(dim=1)  # [G, E]: no gradient flows through the counts
    p_mean = probs.view(groups, tokens // groups, experts).mean(dim=1)  # [G, E]: the router's gradient flows here
    return (experts * (f * p_mean).sum(dim=-1)).mean()


def kept_assignments(routing: Routing) -> tuple[torch.Tensor, torch.Tensor]:
    """(token, choice) of every kept assignment, ordered by expert, then by slot in its queue."""
    token, choice = routing.keep.nonzero(as_tuple=True)
    expert, slot = routing.expert[token, choice], routing.slot[token, choice]
    order = torch.argsort(expert * (routing.capacity + 1) + slot)
    return token[order], choice[order]


class Expert(nn.Module):
    """One expert: the dense MLP's shape, fc = Linear(h, mlp_ratio·h), GELU, proj = Linear(mlp_ratio·h, h)."""

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, hidden)
        self.proj = nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


def run_experts(experts: nn.ModuleList, rows: torch.Tensor, which: torch.Tensor) -> torch.Tensor:
    """Row i through experts[which[i]]; rows already ordered by expert (which is non-decreasing)."""
    counts = torch.bincount(which, minlength=len(experts)).tolist()
    pieces = [experts[e](part) for e, part in enumerate(rows.split(counts)) if counts[e]]
    return torch.cat(pieces) if pieces else rows.new_zeros((0, rows.shape[1]))


class MoE(nn.Module):
    """Router (Linear(h, E), no bias) and E experts; forward [..., h] -> [..., h]; aux_loss and stats kept."""

    def __init__(self, shape: MoEShape, groups: int = 1) -> None:
        super().__init__()
        if shape.experts < 1:
            raise ValueError(f"a mixture of experts needs experts >= 1, got {shape.experts}")
        self.num_experts, self.top_k, self.capacity_factor = shape.experts, shape.top_k, shape.capacity_factor
        self.groups = groups  # routing groups of equal size (GShard's G); the expert-parallel oracle sets N_ep
        self.router = nn.Linear(shape.width, shape.experts, bias=False)
        self.experts = nn.ModuleList(Expert(shape.width, shape.hidden) for _ in range(shape.experts))
        self.aux_loss: torch.Tensor = torch.zeros(())
        self.stats: dict[str, Any] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        routing = route(self.router(flat), self.top_k, self.capacity_factor, self.groups)
        self.aux_loss, self.stats = routing.aux_loss, routing.stats(self.num_experts)
        token, choice = kept_assignments(routing)
        out = run_experts(self.experts, flat[token], routing.expert[token, choice])
        weighted = out * routing.gate[token, choice].unsqueeze(-1)
        return torch.zeros_like(flat).index_add(0, token, weighted).view_as(x)


def aux_loss_of(model: nn.Module) -> torch.Tensor:
    """The sum of the load-balancing losses of every expert layer (MoE or its expert-parallel form), last forward."""
    losses = [m.aux_loss for m in model.modules() if isinstance(getattr(m, "aux_loss", None), torch.Tensor)]
    return torch.stack(losses).sum() if losses else torch.zeros(())
