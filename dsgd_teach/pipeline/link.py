"""Messages between neighbouring stages: activations forward, gradients back, every wait bounded by a timeout.

Sends are posted without waiting (isend) and collected at the end of the step, so two neighbours that send to
each other at the same moment (1F1B's steady state) never deadlock; a receive waits at most `timeout_s` and
then fails loudly, naming the stage, the peer and the microbatch.
"""

from __future__ import annotations

import datetime
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist


@dataclass
class StageLink:
    """One stage's point-to-point endpoint: send(), recv(), and finish() for the sends still in flight."""

    stage: int
    device: torch.device
    timeout_s: float
    _in_flight: list[tuple[Any, torch.Tensor, str]] = field(default_factory=list)

    def _wait(self, work: Any, what: str) -> None:
        try:
            done = work.wait(timeout=datetime.timedelta(seconds=self.timeout_s))
        except RuntimeError as exc:  # gloo raises on timeout or when the peer's connection closes
            raise TimeoutError(f"stage {self.stage}: {what} failed or timed out after {self.timeout_s} s "
                               f"(is a neighbouring stage dead?): {exc}") from exc
        if done is False:
            raise TimeoutError(f"stage {self.stage}: {what} did not complete within {self.timeout_s} s")

    def send(self, tensor: torch.Tensor, dst: int, what: str) -> int:
        """Post tensor to stage dst and return its size in bytes (the wait happens in finish())."""
        tensor = tensor.detach().contiguous()
        self._in_flight.append((dist.isend(tensor, dst), tensor, f"send of {what} to stage {dst}"))
        return tensor.numel() * tensor.element_size()

    def recv(self, shape: tuple[int, ...], src: int, what: str) -> tuple[torch.Tensor, float]:
        """Receive a float32 tensor of `shape` from stage src; (tensor, seconds spent waiting)."""
        buf = torch.empty(shape, dtype=torch.float32, device=self.device)
        t = time.perf_counter()
        self._wait(dist.irecv(buf, src), f"receive of {what} from stage {src}")
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return buf, time.perf_counter() - t

    def finish(self) -> None:
        """Wait (bounded) until every posted send has been delivered."""
        in_flight, self._in_flight = self._in_flight, []
        for work, _tensor, what in in_flight:
            self._wait(work, what)
