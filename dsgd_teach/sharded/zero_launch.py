"""How a ZeRO rank starts its gradient collectives mid-backward: a hook per parameter, a unit's collective as soon
as backward has produced all its gradients, in the same order on every rank (as DDP's buckets start).

`ZeroAdam` (zero_base.py) builds on this; each stage says what its collective is (`_start`) and how many may be
in flight (`_make_room`). Watchers (a memory meter) are told of each moment a rank's holdings may peak.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .shard_ops import Pending
from .zero_units import Unit


class GradientLaunches:
    """Start each unit's gradient collective once backward has produced every gradient of the unit."""

    units: list[Unit]
    order: list[Unit]  # the order units start their collectives in, on every rank (reverse registration)
    _next: int
    _fired: set[int]  # ids of the parameters whose gradient backward produced since the last step
    in_flight: list[list[Any]]  # [unit, Pending, the full gradient it reads (stages 2-3) or None]
    events: list[dict[str, Any]]
    watchers: list[Callable[[str], None]]  # told of each moment: "collective", "gathered", "step"

    def _start(self, u: Unit) -> list[Any]:
        """Each stage: start the unit's gradient collective, [unit, Pending, the full gradient it reads or None]."""
        raise NotImplementedError

    def _keep(self, u: Unit, reduced: torch.Tensor) -> torch.Tensor:
        """Each stage: where this rank keeps its part of the unit's summed gradient, given the collective's output."""
        raise NotImplementedError

    def _make_room(self) -> None:
        """Before a collective starts: finish older ones if the stage bounds what is in flight (none by default)."""

    def _hook_gradients(self) -> None:
        """Call _grad_ready once backward has accumulated each parameter's gradient."""
        for u in self.units:
            for p in u.params:
                p.register_post_accumulate_grad_hook(lambda p, u=u: self._grad_ready(u, p))

    def _grad_ready(self, u: Unit, p: torch.Tensor) -> None:
        if id(p) in self._fired:
            raise ValueError("ZeroAdam: backward ran twice before step(); call step() after every backward "
                             "(gradient accumulation is not supported)")
        self._fired.add(id(p))
        u.waiting -= 1
        while self._next < len(self.order) and self.order[self._next].waiting == 0:
            self._launch(self.order[self._next])

    def _launch(self, u: Unit) -> None:
        """Start unit u's gradient collective (a gradient backward did not produce counts as zeros)."""
        self._next += 1
        self._make_room()
        self._tell("collective")
        self.in_flight.append(self._start(u))

    def _complete(self, entry: list[Any]) -> None:
        """Wait for a unit's gradient collective and keep this rank's part of the sum (the full gradient is freed)."""
        u, pending = entry[0], entry[1]
        if u.grad_shard is None:
            reduced = pending.wait()
            entry[2] = None
            u.grad_shard = self._keep(u, reduced)
            self._record(u, pending)

    def _record(self, u: Unit, pending: Pending) -> None:
        """Note when a unit's collective started and ended (chapter 09's timeline)."""
        self.events.append({"unit": self.units.index(u), "what": pending.what, "launch_s": pending.launch_s,
                            "done_s": pending.done_s})

    def _tell(self, moment: str) -> None:
        for watch in self.watchers:
            watch(moment)

    def take_events(self) -> list[dict[str, Any]]:
        """The collectives since the last call: unit, what, launch_s and done_s on time.perf_counter's clock."""
        out, self.events = self.events, []
        return out
