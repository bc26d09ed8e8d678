"""A device mesh: N ranks laid out as a grid of data × pipeline × context × tensor, one process group per axis line.

Rank order. The mesh is torch's `DeviceMesh` convention, `arange(N).reshape(sizes)`: the *last* axis varies
fastest. The axes, outermost first, are MESH_ORDER = (pp, dp, cp, tp), the order Megatron-LM uses (its rank
generator's default "tp-cp-ep-dp-pp", fastest first): tensor parallelism, which talks in every layer's forward and
backward, gets neighbouring ranks (on a real machine, the GPUs of one node on its fastest links); the pipeline,
which sends only each microbatch's activations, spans the slowest links (Shoeybi et al. 2019, section 5; Narayanan
et al. 2021, section 3.3; "How to Scale Your Model", part 5). So rank = ((pp_i·N_dp + dp_i)·N_cp + cp_i)·N_tp + tp_i.

Expert parallelism borrows the data-parallel ranks rather than adding ranks of its own (GShard, Lepikhin et al.
2021, section 3; Switch Transformer, Fedus et al. 2022, section 5.5 and figure 9; torchtitan and Megatron-Core do
the same): the N_dp data-parallel ranks split into N_dp/N_ep groups of N_ep, and the N_ep ranks of a group hold
different experts (the all-to-all runs among them) while every rank still holds the same dense weights. So the
world is N = N_dp·N_tp·N_cp·p whatever N_ep, and a 4-axis layout (dp, tp, pp, ep) fits 8 ranks. Two more groups
follow: "edp", the ranks that hold the same experts (the experts' gradients are averaged there: N_dp/N_ep ranks),
and "ep" itself, the fastest-varying part of dp.

Every rank calls `join_mesh` after joining the world: it creates every group of every axis in the same order (as
torch.distributed.new_group requires) and returns a byte-counting Comm per axis, whose ranks are the positions in
this rank's group, so chapter 05's collectives and the ring run on one axis unchanged and log what they send.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist

from ..config import Config, check_int
from ..runtime.ranks.comm import Comm, TorchDistributed

#: Axes of a layout, as the chapter names them: data, tensor, pipeline, context and expert parallelism.
AXES = ("dp", "tp", "pp", "cp", "ep")
#: The mesh's dimensions, outermost (slowest-varying rank index) first; ep splits dp into (edp, ep) when N_ep > 1.
MESH_ORDER = ("pp", "dp", "cp", "tp")
#: The most ranks one layout may use on the course's clusters.
MAX_RANKS = 8


@dataclass(frozen=True)
class Layout(Config):
    """Axis sizes of a mesh: N_dp·N_tp·p·N_cp ranks (N_ep of the N_dp data-parallel ranks share out the experts)."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1

    def validate(self) -> None:
        for axis in AXES:
            check_int(axis, getattr(self, axis), 1, MAX_RANKS)
        if self.world > MAX_RANKS:
            raise ValueError(f"dp·tp·pp·cp must be at most {MAX_RANKS} ranks, got {self.dp}·{self.tp}·{self.pp}·"
                             f"{self.cp} = {self.world}")
        if self.dp % self.ep:
            raise ValueError(f"ep must divide dp (expert parallelism uses the data-parallel ranks), got ep={self.ep}, "
                             f"dp={self.dp}")
        if self.cp > 1 and self.ep > 1:
            raise ValueError(f"a layout uses cp or ep, not both; got cp={self.cp}, ep={self.ep}")

    @property
    def world(self) -> int:
        """N: how many ranks the layout needs."""
        return self.dp * self.tp * self.pp * self.cp

    @property
    def active(self) -> tuple[str, ...]:
        """The axes of size > 1, in AXES order (a '3-axis layout' has three)."""
        return tuple(a for a in AXES if getattr(self, a) > 1)

    def dims(self) -> tuple[tuple[str, int], ...]:
        """The mesh's dimensions (name, size), outermost first, as init_device_mesh would take them."""
        out: list[tuple[str, int]] = []
        for axis in MESH_ORDER:
            if axis == "dp" and self.ep > 1:
                out += [("edp", self.dp // self.ep), ("ep", self.ep)]
            else:
                out.append((axis, getattr(self, axis)))
        return tuple(out)

    def coords(self, rank: int) -> dict[str, int]:
        """This rank's index along each axis (dp, tp, pp, cp; ep and edp: dp's two parts, dp = edp·N_ep + ep)."""
        check_int("rank", rank, 0, self.world - 1)
        out: dict[str, int] = {}
        rest = rank
        for axis in reversed(MESH_ORDER):  # the last dimension varies fastest
            out[axis] = rest % getattr(self, axis)
            rest //= getattr(self, axis)
        return {**out, "ep": out["dp"] % self.ep, "edp": out["dp"] // self.ep}

    def rank_of(self, dp: int = 0, tp: int = 0, pp: int = 0, cp: int = 0) -> int:
        """The rank at these coordinates (ep and edp are parts of dp)."""
        for name, value in (("dp", dp), ("tp", tp), ("pp", pp), ("cp", cp)):
            check_int(name, value, 0, getattr(self, name) - 1)
        return ((pp * self.dp + dp) * self.cp + cp) * self.tp + tp

    def groups(self, axis: str) -> list[tuple[int, ...]]:
        """Every group of `axis`: the ranks whose coordinates differ only along it (ordered by their index on it)."""
        if axis not in (*AXES, "edp"):
            raise ValueError(f"axis must be one of {', '.join((*AXES, 'edp'))}; got {axis!r}")
        members: dict[tuple[int, ...], list[tuple[int, int]]] = {}
        for rank in range(self.world):
            c = self.coords(rank)
            # what stays fixed in a group: every other coordinate (for ep and edp, the other part of dp)
            varies = {"dp": ("dp", "ep", "edp"), "ep": ("dp", "ep"), "edp": ("dp", "edp")}.get(axis, (axis,))
            fixed = tuple(v for k, v in c.items() if k not in varies)
            members.setdefault(fixed, []).append((c[axis], rank))
        return sorted(tuple(r for _, r in sorted(m)) for m in members.values())

    def group_of(self, axis: str, rank: int) -> tuple[int, ...]:
        """The ranks of `axis`'s group that holds `rank`."""
        return next(g for g in self.groups(axis) if rank in g)

    def check_fits(self, heads: int, mlp_hidden: int, layers: int, seq_len: int, experts: int) -> None:
        """Raise ValueError, naming the axis, when a model of these sizes cannot be split this way."""
        if heads % self.tp:
            raise ValueError(f"tp={self.tp} must divide the heads (a={heads}): each tensor rank holds whole heads")
        if mlp_hidden % self.tp:
            raise ValueError(f"tp={self.tp} must divide the MLP's hidden width ({mlp_hidden})")
        if (seq_len // self.cp) % self.tp:
            raise ValueError(f"tp={self.tp} must divide each context rank's seq_len/cp = {seq_len // self.cp} tokens: "
                             "sequence parallelism splits them")
        if layers < self.pp:
            raise ValueError(f"pp={self.pp} stages need at least as many layers, got L={layers}")
        if self.cp > 1 and seq_len % (2 * self.cp):
            raise ValueError(f"cp={self.cp} needs seq_len ({seq_len}) divisible by 2·cp: each context rank holds "
                             "two mirrored chunks")
        if self.ep > 1 and (experts == 0 or experts % self.ep):
            raise ValueError(f"ep={self.ep} must divide the experts (E={experts}, and E > 0)")


class GroupTransport(TorchDistributed):
    """A Comm transport on one sub-group: the Comm's ranks are positions in `ranks`, sent on the group's links."""

    def __init__(self, ranks: tuple[int, ...], group: Any) -> None:
        self.ranks, self.group = ranks, group

    def peer(self, rank: int) -> int:
        """The global rank of the sub-group's position `rank`."""
        return self.ranks[rank]


@dataclass
class Mesh:
    """This rank's place in a layout: its coordinates, and a byte-counting Comm and process group per axis."""

    layout: Layout
    rank: int
    coords: dict[str, int]
    comms: dict[str, Comm] = field(default_factory=dict)
    groups: dict[str, Any] = field(default_factory=dict)
    _all_groups: list[Any] = field(default_factory=list, repr=False)

    def close(self) -> None:
        """Leave every sub-group this rank created."""
        for group in self._all_groups:
            if group is not None and group != dist.GroupMember.NON_GROUP_MEMBER:
                dist.destroy_process_group(group)
        self._all_groups.clear()

    def bytes_sent(self) -> dict[str, int]:
        """Bytes this rank sent on each axis since the logs were last taken."""
        return {axis: c.bytes_sent() for axis, c in self.comms.items()}


def join_mesh(layout: Layout, comm: Comm, axes: tuple[str, ...] = (*AXES, "edp")) -> Mesh:
    """Every rank calls this, in the world `comm` belongs to: create each axis's groups in one order; its Mesh."""
    if comm.world != layout.world:
        raise ValueError(f"the layout needs {layout.world} ranks, the group has {comm.world}")
    mesh = Mesh(layout, comm.rank, layout.coords(comm.rank))
    timeout = datetime.timedelta(seconds=comm.timeout_s)
    for axis in axes:
        if axis == "edp" and layout.ep == 1:  # every data-parallel rank holds every expert: the dp group
            continue
        for ranks in layout.groups(axis):
            if len(ranks) == 1:  # a group of one talks to nobody: no process group needed
                if comm.rank in ranks:
                    mesh.comms[axis] = Comm(0, 1, comm.device, comm.timeout_s)
                continue
            group = dist.new_group(list(ranks), timeout=timeout)  # every rank, every group, the same order
            mesh._all_groups.append(group)
            if comm.rank in ranks:
                mesh.groups[axis] = group
                mesh.comms[axis] = Comm(ranks.index(comm.rank), len(ranks), comm.device, comm.timeout_s,
                                        transport=GroupTransport(ranks, group))
    if "edp" in axes and layout.ep == 1 and "dp" in mesh.comms:
        mesh.comms["edp"] = mesh.comms["dp"]
        if "dp" in mesh.groups:
            mesh.groups["edp"] = mesh.groups["dp"]
    return mesh
