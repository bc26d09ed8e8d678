"""Expert parallelism: each of N_ep ranks holds E/N_ep experts; tokens travel to their experts and back by all-to-all.

Every rank keeps the router (replicated) and routes its own tokens as one group (experts.route), so the routing,
capacity and drops are exactly those of the single-process MoE with groups = N_ep. Then, as in GShard's sharded MoE
layer, whose dispatch and combine the compiler turns into AllToAll (Lepikhin et al. 2021, "GShard: Scaling Giant
Models with Conditional Computation and Automatic Sharding", ICLR):
1. dispatch: the kept assignments, ordered by expert (so by the rank holding it), go to their experts' ranks in one
   all-to-all, after a small all-to-all of how many rows each local expert will receive from each rank;
2. each rank runs its experts on the rows it received;
3. combine: the outputs go back by the reverse all-to-all, and each token sums its experts' outputs, each weighted
   by its gate. The backward runs both all-to-alls in reverse (collectives.all_to_all.AllToAll).

The router's gradient on each rank covers that rank's tokens only: summed over the group (as data parallelism does)
it is the single-process gradient. Each expert's gradient is complete on the rank that holds it.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..collectives.all_to_all import all_to_all_bytes, differentiable_all_to_all, exchange_counts
from ..runtime.ranks.comm import Comm
from .experts import MoE, kept_assignments, route, run_experts
from .mesh import GroupTransport


def expert_range(experts: int, world: int, rank: int) -> range:
    """The experts rank `rank` holds: E/N_ep consecutive ones; ValueError unless N_ep divides E."""
    if world < 1 or experts % world:
        raise ValueError(f"the expert-parallel group's {world} ranks must divide the {experts} experts evenly")
    per = experts // world
    return range(rank * per, (rank + 1) * per)


def group_comm(group: Any, device: torch.device, timeout_s: float) -> Comm:
    """A byte-counting Comm on a torch.distributed process group (None: the default group), ranks within it."""
    ranks = tuple(dist.get_process_group_ranks(group)) if group is not None else tuple(range(dist.get_world_size()))
    return Comm(dist.get_rank(group), len(ranks), device, timeout_s, transport=GroupTransport(ranks, group))


class ExpertParallelMoE(nn.Module):
    """The MoE layer split over an expert-parallel group: same router, this rank's E/N_ep experts (copied).

    The group is a Comm (a mesh's `comms["ep"]`, or threads' in a test) or a torch.distributed process group.
    """

    def __init__(self, moe: MoE, group: Any = None, comm: Comm | None = None, timeout_s: float = 60.0) -> None:
        super().__init__()
        if comm is None:
            comm = group_comm(group, next(moe.parameters()).device, timeout_s)
        self.comm = comm
        self.num_experts, self.top_k, self.capacity_factor = moe.num_experts, moe.top_k, moe.capacity_factor
        self.local = expert_range(moe.num_experts, comm.world, comm.rank)
        self.router = copy.deepcopy(moe.router)
        self.experts = nn.ModuleList(copy.deepcopy(moe.experts[e]) for e in self.local)
        self.aux_loss: torch.Tensor = torch.zeros(())
        self.stats: dict[str, Any] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        comm, n, per = self.comm, self.comm.world, len(self.local)
        flat = x.reshape(-1, x.shape[-1])
        routing = route(self.router(flat), self.top_k, self.capacity_factor)  # this rank's tokens: one group
        self.aux_loss = routing.aux_loss
        token, choice = kept_assignments(routing)  # ordered by expert, so by the rank that holds it
        expert = routing.expert[token, choice]
        to_each = torch.bincount(expert, minlength=self.num_experts).view(n, per)  # [rank, its local expert]
        sent_before = comm.bytes_sent()
        from_each = exchange_counts(comm, to_each)  # [source rank, my local expert]
        send, recv = to_each.sum(dim=1).tolist(), from_each.sum(dim=1).tolist()
        rows = differentiable_all_to_all(comm, flat[token], send, recv, "dispatch")
        # Rows arrive by source rank, then by local expert: group them by local expert to run each expert once.
        which = torch.arange(per, device=flat.device).repeat(n).repeat_interleave(from_each.reshape(-1))
        order = torch.argsort(which, stable=True)
        done = run_experts(self.experts, rows[order], which[order])[torch.argsort(order)]
        back = differentiable_all_to_all(comm, done, recv, send, "combine")
        weighted = back * routing.gate[token, choice].unsqueeze(-1)
        self.stats = routing.stats(self.num_experts) | {
            "received_per_local_expert": from_each.sum(dim=0).tolist(), "rows_sent": send, "rows_received": recv,
            "bytes_sent": comm.bytes_sent() - sent_before,
        }
        return torch.zeros_like(flat).index_add(0, token, weighted).view_as(x)


def counts_bytes(experts: int, world: int) -> int:
    """Bytes of the counts all-to-all one rank sends per forward: E/N_ep int64 counts to each other rank."""
    return (world - 1) * (experts // world) * 8


def expert_parallel_bytes(rows_sent: list[int], rows_received: list[int], rank: int, width: int,
                          element_size: int, experts: int, backward: bool = True) -> int:
    """Bytes `rank` sends in one forward (and backward) of the layer, from the rows it sent to and got from each rank.

    Forward: the counts, dispatch (its rows to the other ranks) and combine (the rows it received, back to their
    senders); the backward sends the same rows' gradients the other way, and no counts.
    """
    row = width * element_size
    rows = all_to_all_bytes(rows_sent, rank, row) + all_to_all_bytes(rows_received, rank, row)
    return rows * (2 if backward else 1) + counts_bytes(experts, len(rows_sent))
