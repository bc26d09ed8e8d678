"""The torch work being timed: a matmul, a convolution and an MLP training step, each built from a seed.

These run inside a fresh child process (see zygote.py) after its thread pools were sized; nothing here touches
torch's thread settings. Each builder returns a zero-argument callable doing one unit of work, plus its FLOPs.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

OPS = ("matmul", "conv", "mlp")


@dataclass
class Bench:
    """One prepared, warmed-up piece of work: `fn()` does one unit (None: a demo, not timed); `extra` is reported."""

    workload: str
    variant: str
    fn: Callable[[], Any] | None
    flops: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


def median_time(fn: Callable[[], Any], repeats: int) -> tuple[float, float]:
    """(median, min) wall seconds of fn() over `repeats` calls, each timed with time.perf_counter."""
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), min(times)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def matmul_bench(size: int, seed: int) -> Bench:
    """C = A @ B for two size x size float32 matrices: 2 n^3 FLOPs, the textbook intra-op parallel op."""
    g = _gen(seed)
    a, b = torch.randn(size, size, generator=g), torch.randn(size, size, generator=g)
    return Bench("matmul", "", lambda: torch.mm(a, b), 2.0 * size**3, {"shape": f"{size}x{size}"})


def conv_bench(size: int, seed: int) -> Bench:
    """A 3x3 convolution, 16 -> 32 channels, batch 16, on (size/16)^2 images (at least 8x8)."""
    side = max(8, size // 16)
    g = _gen(seed)
    x = torch.randn(16, 16, side, side, generator=g)
    w = torch.randn(32, 16, 3, 3, generator=g) / 12.0
    flops = 2.0 * 16 * 32 * 16 * 9 * side * side
    return Bench("conv", "", lambda: F.conv2d(x, w, padding=1), flops, {"shape": f"16x16x{side}x{side}"})


def mlp_bench(size: int, seed: int) -> Bench:
    """One SGD step (forward, backward, update) of a size-wide two-hidden-layer MLP on a batch of 128."""
    g = _gen(seed)
    dims = [size, size, size, 10]
    params = [(torch.randn(o, i, generator=g) / i**0.5).requires_grad_() for i, o in zip(dims, dims[1:], strict=False)]
    x = torch.randn(128, size, generator=g)
    y = torch.randint(0, 10, (128,), generator=g)

    def step() -> float:
        h = x
        for k, w in enumerate(params):
            h = h @ w.T
            if k < len(params) - 1:
                h = torch.relu(h)
        loss = F.cross_entropy(h, y)
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for w, gw in zip(params, grads, strict=True):
                w -= 0.01 * gw
        return float(loss.detach())

    flops = 3 * 2.0 * 128 * sum(i * o for i, o in zip(dims, dims[1:], strict=False))
    return Bench("mlp", "", step, flops, {"shape": f"128x{size}"})


BUILDERS: dict[str, Callable[[int, int], Bench]] = {"matmul": matmul_bench, "conv": conv_bench, "mlp": mlp_bench}


def op_benches(ops: list[str], size: int, seed: int, warmup: int) -> list[Bench]:
    """Build and warm up (first calls allocate and pick kernels) the benches for the named ops."""
    out = []
    for name in ops:
        bench = BUILDERS[name](size, seed)
        for _ in range(warmup):
            bench.fn()
        out.append(bench)
    return out
