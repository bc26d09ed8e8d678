"""The chapter's model and data: a deterministic MLP and per-(step, rank) regression batches any rank can rebuild."""

from __future__ import annotations

import torch


def make_mlp(width: int, depth: int, d_in: int = 32, d_out: int = 8, seed: int = 0,
             dtype: torch.dtype = torch.float32) -> torch.nn.Sequential:
    """depth Linear layers (d_in -> width -> ... -> d_out) with Tanh between them, same weights for the same seed."""
    gen = torch.Generator().manual_seed(seed)
    dims = [d_in] + [width] * (depth - 1) + [d_out]
    layers: list[torch.nn.Module] = []
    for i, (a, b) in enumerate(zip(dims[:-1], dims[1:], strict=True)):
        lin = torch.nn.Linear(a, b, dtype=dtype)
        with torch.no_grad():
            lin.weight.copy_(torch.randn(b, a, generator=gen) / a ** 0.5)
            lin.bias.copy_(torch.randn(b, generator=gen) * 0.1)
        layers.append(lin)
        if i < len(dims) - 2:
            layers.append(torch.nn.Tanh())
    return torch.nn.Sequential(*layers)


def batch(seed: int, step: int, rank: int, rows: int, d_in: int = 32, d_out: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets of one rank's batch at one step: a fixed random linear map plus noise."""
    teacher = torch.Generator().manual_seed(seed + 7919)
    w = torch.randn(d_in, d_out, generator=teacher) / d_in ** 0.5
    gen = torch.Generator().manual_seed(((seed * 1_000_003 + step) * 1009 + rank) % (2**62))
    x = torch.randn(rows, d_in, generator=gen)
    return x, torch.tanh(x @ w) + 0.05 * torch.randn(rows, d_out, generator=gen)


def n_params(module: torch.nn.Module) -> int:
    """Number of parameters (elements) of a module: Psi in Rajbhandari et al.'s notation."""
    return sum(p.numel() for p in module.parameters())


def flat_params(module: torch.nn.Module) -> torch.Tensor:
    """Every parameter of module, concatenated (a float32 copy)."""
    return torch.cat([p.detach().float().reshape(-1) for p in module.parameters()])
