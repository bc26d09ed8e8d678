"""Reading a ZeRO model back: the whole parameters (stage 3 gathers them first), its state dict, its formula."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Executor
from contextlib import contextmanager

import torch

from ..runtime.ranks.comm import Comm
from .zero_formulas import zero_formula
from .zero_units import Unit


class ReadBack:
    """The model read whole, and what Rajbhandari et al.'s formula says a rank of this stage holds."""

    model: torch.nn.Module
    comm: Comm
    units: list[Unit]
    dtype: torch.dtype
    stage: int
    _pool: Executor | None

    @contextmanager
    def gathered(self) -> Iterator[None]:
        """Every parameter whole while inside (stage 3 all-gathers them: every rank must enter)."""
        yield

    def full_params(self) -> torch.Tensor:
        """Every parameter of the model (frozen ones too), in model.parameters() order, as one fp32 vector."""
        with self.gathered():
            return torch.cat([p.detach().float().reshape(-1) for p in self.model.parameters()])

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The model's full state dict, copied (stage 3 gathers it: every rank must call)."""
        with self.gathered():
            return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def formula(self, mixed: bool | None = None) -> dict[str, float]:
        """Rajbhandari et al.'s bytes per rank for this stage (Ψ = padded parameter count); mixed defaults to the
        optimizer's own precision (bf16/fp16: 2Ψ + 2Ψ + 12Ψ; fp32: 4Ψ + 4Ψ + 8Ψ)."""
        mixed = self.dtype != torch.float32 if mixed is None else mixed
        return zero_formula(sum(u.padded for u in self.units), self.comm.world, self.stage, mixed=mixed)

    def close(self) -> None:
        """Stop the communication thread (ring only)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
