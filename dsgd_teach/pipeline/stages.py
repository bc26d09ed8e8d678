"""Splitting a model into pipeline stages: a deep MLP or the course CNN cut into p consecutive pieces.

A model is a list of *units* (a Linear layer with its ReLU, or a few CNN layers that belong together); stage s
owns a contiguous run of units, so the only tensors that cross a stage boundary are the activations going
forward and their gradients coming back, exactly the edges DistBelief and TensorFlow's Send/Recv cut.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from ..config import check_choice, check_int
from ..models import build_model

PIPELINE_MODELS = ("mlp", "cnn")


def build_units(model: str, n_features: int, n_classes: int, depth: int, hidden: int, seed: int) -> list[nn.Module]:
    """The model as a list of units, initialised from `seed` (torch's global RNG is left untouched)."""
    check_choice("model", model, PIPELINE_MODELS)
    if model == "cnn":
        cnn = list(build_model("cnn", n_features, n_classes, seed=seed).children())
        # reshape+conv+relu | pool | flatten | linear: four units, so up to four stages
        return [nn.Sequential(*cnn[:3]), cnn[3], cnn[4], cnn[5]]
    check_int("depth", depth, 1, 64)
    widths = [n_features] + [hidden] * (depth - 1) + [n_classes]
    units: list[nn.Module] = []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for i in range(depth):
            layer = nn.Linear(widths[i], widths[i + 1])
            units.append(nn.Sequential(layer, nn.ReLU()) if i < depth - 1 else layer)
    return units


def stage_bounds(n_units: int, stages: int) -> list[tuple[int, int]]:
    """[start, stop) unit ranges of each stage, as even as possible (the first stages take the extra unit)."""
    check_int("stages", stages, 1, n_units)
    cuts = np.array_split(np.arange(n_units), stages)
    return [(int(c[0]), int(c[-1]) + 1) for c in cuts]


def stage_module(units: list[nn.Module], stages: int, stage: int) -> nn.Sequential:
    """The units stage `stage` owns, as one module."""
    start, stop = stage_bounds(len(units), stages)[stage]
    return nn.Sequential(*units[start:stop])


@torch.no_grad()
def boundary_shapes(units: list[nn.Module], stages: int, n_features: int) -> list[tuple[int, ...]]:
    """Shape of one row of the activation entering each stage (stage 0: the input row)."""
    x = torch.zeros(1, n_features)
    shapes = []
    for start, stop in stage_bounds(len(units), stages):
        shapes.append(tuple(x.shape[1:]))
        for unit in units[start:stop]:
            x = unit(x)
    return shapes


def flat_params(module: nn.Module) -> np.ndarray:
    """A module's parameters as one float32 vector (empty when it has none)."""
    ps = [p.detach().reshape(-1).cpu() for p in module.parameters()]
    return torch.cat(ps).numpy().astype(np.float32) if ps else np.zeros(0, np.float32)


def flat_grads(module: nn.Module) -> np.ndarray:
    """A module's accumulated gradients as one float32 vector (zeros where none was computed)."""
    gs = [(p.grad if p.grad is not None else torch.zeros_like(p)).detach().reshape(-1).cpu()
          for p in module.parameters()]
    return torch.cat(gs).numpy().astype(np.float32) if gs else np.zeros(0, np.float32)


def microbatch_slices(rows: int, microbatches: int) -> list[slice]:
    """Split `rows` into `microbatches` consecutive slices whose sizes differ by at most one."""
    check_int("microbatches", microbatches, 1, rows)
    sizes = [rows // microbatches + (1 if i < rows % microbatches else 0) for i in range(microbatches)]
    starts = np.cumsum([0] + sizes)
    return [slice(int(starts[i]), int(starts[i + 1])) for i in range(microbatches)]
