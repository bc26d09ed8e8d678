"""Activation checkpointing (Chen et al. 2016): keep only segment inputs in forward, recompute inside in backward.

`Recompute` is the idea in twenty lines, a custom autograd function; `torch` is torch.utils.checkpoint doing the
same. measure() runs the three ways on the same MLP and batch and reports the bytes autograd kept for backward,
the time of forward + backward, and the gradients, which must not change.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.utils.checkpoint

from .toy import batch, make_mlp
from .zero import activation_meter

HOW = ("none", "manual", "torch")


class Recompute(torch.autograd.Function):
    """Run fn without recording in forward; in backward, run it again with recording and backpropagate through it."""

    @staticmethod
    def forward(ctx: Any, fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        ctx.fn = fn
        ctx.save_for_backward(x)  # the only activation this segment keeps
        with torch.no_grad():
            return fn(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, torch.Tensor | None]:
        (x,) = ctx.saved_tensors
        x = x.detach().requires_grad_(True)
        with torch.enable_grad():
            out = ctx.fn(x)  # the forward again: this is the recompute time paid for the memory
        torch.autograd.backward(out, grad)  # also accumulates the segment's parameter gradients
        return None, x.grad


def segments(model: torch.nn.Sequential, n: int) -> list[torch.nn.Sequential]:
    """model cut into n consecutive pieces of about equal length (Chen et al. choose n near sqrt(layers))."""
    layers = list(model)
    size = -(-len(layers) // n)
    return [torch.nn.Sequential(*layers[i:i + size]) for i in range(0, len(layers), size)]


def forward(model: torch.nn.Sequential, x: torch.Tensor, how: str = "none", n_segments: int = 2) -> torch.Tensor:
    """model(x), with each of n_segments segments checkpointed by hand ("manual"), by torch ("torch") or not ("none")."""
    if how == "none":
        return model(x)
    for seg in segments(model, n_segments):
        if how == "manual":
            x = Recompute.apply(seg, x)
        else:
            x = torch.utils.checkpoint.checkpoint(seg, x, use_reentrant=True)
    return x


def measure(width: int = 256, depth: int = 16, rows: int = 256, how: str = "none", n_segments: int = 4,
            repeats: int = 3, seed: int = 0) -> dict[str, Any]:
    """Saved activation bytes, median forward+backward seconds and the gradient of one way of checkpointing."""
    model = make_mlp(width, depth, seed=seed)
    x, y = batch(seed, 0, 0, rows)
    x.requires_grad_(True)  # torch's reentrant checkpoint needs an input that requires grad
    times, saved = [], 0
    for _ in range(repeats):
        model.zero_grad()
        hooks, total = activation_meter(model)
        t = time.perf_counter()
        with hooks:
            out = forward(model, x, how, n_segments)
        torch.nn.functional.mse_loss(out, y).backward()
        times.append(time.perf_counter() - t)
        saved = total[0]
    grad = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    return {"how": how, "segments": n_segments, "activation_bytes": saved,
            "seconds": sorted(times)[len(times) // 2], "grad": grad.numpy()}
