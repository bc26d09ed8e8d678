"""The collectives of tensor and sequence parallelism on one tensor-parallel group, each one counted.

`TensorGroup(comm, how, group)` holds the N_tp ranks' Comm (chapter 05's byte-counting handle; its ranks are the
positions in the group, as mesh.join_mesh builds them) and offers the three collectives that Megatron's operators
need: an allreduce of a whole activation, and the all-gather / reduce-scatter of one along the sequence dimension.
`how="ring"` runs chapter 05's ring (collectives.algorithms.ring_allreduce; the ring's two halves in
sharded.shard_ops) message by message through the Comm; `how="library"` calls torch.distributed's own on `group`
(None: the default group), faster, and logs in the Comm what a ring would send, as sharded/shard_ops.py does.

Every call appends a record to `records`: the operator (f, g, ...), the collective, the elements K of the whole
activation, and the bytes this rank sent, so a test can check them against the formulas: a ring allreduce of K
elements sends 2(N_tp - 1)/N_tp · K elements per rank, an all-gather or a reduce-scatter (N_tp - 1)/N_tp · K.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from ..collectives.algorithms import ring_allreduce
from ..runtime.ranks.comm import Comm
from ..sharded.shard_ops import ring_all_gather, ring_reduce_scatter

HOW = ("ring", "library")


def ring_bytes(collective: str, elements: int, world: int, element_size: int = 4) -> int:
    """Bytes one rank sends in a ring `collective` ("allreduce", "all-gather", "reduce-scatter") of K elements."""
    share = elements * (world - 1) // world
    return element_size * (2 * share if collective == "allreduce" else share)


def bytes_by_op(records: list[dict[str, Any]]) -> dict[str, int]:
    """Bytes sent per operator in `records`, keyed bytes_<op> ("g forward" -> "bytes_g_forward")."""
    out: dict[str, int] = {}
    for rec in records:
        key = "bytes_" + rec["op"].replace(" ", "_").replace("-", "_")
        out[key] = out.get(key, 0) + rec["bytes_sent"]
    return out


class TensorGroup:
    """The N_tp ranks that split one layer's tensors: allreduce, sequence all-gather and reduce-scatter, counted."""

    def __init__(self, comm: Comm, how: str = "ring", group: Any = None) -> None:
        if how not in HOW:
            raise ValueError(f"how must be one of {', '.join(map(repr, HOW))}; got {how!r}")
        self.comm, self.how, self.group = comm, how, group
        self.rank, self.size = comm.rank, comm.world
        self.records: list[dict[str, Any]] = []

    def all_reduce(self, x: torch.Tensor, op: str) -> torch.Tensor:
        """The sum over the group of x (any shape), as a new tensor."""
        if self.size == 1:
            return x
        start = len(self.comm.log)
        if self.how == "ring":
            out = ring_allreduce(self.comm, x)
        else:
            out = x.detach().contiguous().clone()
            self._note_library(out.numel() // self.size, "reduce-scatter", out.element_size())
            self._note_library(out.numel() // self.size, "all-gather", out.element_size())
            self.comm.wait_all([dist.all_reduce(out, group=self.group, async_op=True)], f"{op}'s allreduce")
        self._record(op, "allreduce", x.numel(), start)
        return out

    def all_gather_sequence(self, x: torch.Tensor, op: str) -> torch.Tensor:
        """[B, s/N_tp, h] on each rank -> [B, s, h]: every rank's chunk of the sequence, in rank order."""
        if self.size == 1:
            return x
        start = len(self.comm.log)
        b, chunk, h = x.shape
        rows = x.detach().transpose(0, 1).contiguous().view(-1)  # [s/N, B, h]: the chunk is one contiguous run
        if self.how == "ring":
            flat = ring_all_gather(self.comm, rows)
        else:
            flat = torch.empty(rows.numel() * self.size, dtype=x.dtype, device=x.device)
            self._note_library(rows.numel(), "all-gather", rows.element_size())
            self.comm.wait_all([dist.all_gather_single(flat, rows, group=self.group, async_op=True)],
                               f"{op}'s all-gather")
        self._record(op, "all-gather", flat.numel(), start)
        return flat.view(chunk * self.size, b, h).transpose(0, 1)

    def reduce_scatter_sequence(self, x: torch.Tensor, op: str) -> torch.Tensor:
        """[B, s, h] on each rank -> [B, s/N_tp, h]: this rank's chunk of the sequence, summed over the group."""
        if self.size == 1:
            return x
        start = len(self.comm.log)
        b, s, h = x.shape
        if s % self.size:
            raise ValueError(f"seq_len must be a multiple of N_tp={self.size} for sequence parallelism, got {s}")
        rows = x.detach().transpose(0, 1).contiguous().view(-1)  # [s, B, h]: chunk r is rows r·s/N ... (r+1)·s/N
        if self.how == "ring":
            flat = ring_reduce_scatter(self.comm, rows)
        else:
            flat = torch.empty(rows.numel() // self.size, dtype=x.dtype, device=x.device)
            self._note_library(flat.numel(), "reduce-scatter", flat.element_size())
            self.comm.wait_all([dist.reduce_scatter_single(flat, rows, group=self.group, async_op=True)],
                               f"{op}'s reduce-scatter")
        self._record(op, "reduce-scatter", rows.numel(), start)
        return flat.view(s // self.size, b, h).transpose(0, 1)

    def _note_library(self, shard_elements: int, phase: str, element_size: int) -> None:
        """Log what a ring would send for the library's collective: N-1 shards of `shard_elements` from this rank."""
        sent = shard_elements * (self.size - 1)
        self.comm.log.append({"rank": self.rank, "direction": "send", "src": self.rank, "dst": -1, "step": 0,
                              "phase": phase, "chunk": -1, "elements": sent, "bytes": element_size * sent})

    def _record(self, op: str, collective: str, elements: int, start: int) -> None:
        sent = sum(m["bytes"] for m in self.comm.log[start:] if m["direction"] == "send")
        self.records.append({"op": op, "collective": collective, "elements": elements, "bytes_sent": sent})

    def take_records(self) -> list[dict[str, Any]]:
        """The collectives since the last call (and clear them)."""
        out, self.records = self.records, []
        return out
