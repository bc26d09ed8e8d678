"""The oracle of chapter 10's layouts: the single-process GPT (`build_gpt(shape, seed)`) trained on the same global
batches and SGD steps. Every layout's loss in each step, and every rank's slice of the parameters after training,
are the oracle's within fp32 rounding (`compare_with_oracle`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..trace import Result
from .composed import ComposedConfig
from .corpus import batch_at, make_corpus
from .experts import aux_loss_of
from .mesh_parts import build_part, detached_mesh
from .model import build_gpt, lm_loss


def oracle_run(config: ComposedConfig) -> tuple[list[float], torch.nn.Module]:
    """The single-process GPT on the same global batches and SGD steps: (loss of each step, trained model)."""
    model = build_gpt(config.shape, config.seed)
    for module in model.modules():
        if hasattr(module, "groups") and hasattr(module, "num_experts"):
            module.groups = config.groups  # route in the same groups of tokens as the ranks' microbatches
    corpus = make_corpus(config.seed, config.corpus_tokens, config.shape.vocab)
    losses = []
    for step in range(config.steps):
        inputs, targets = batch_at(corpus, step, None, config.batch, config.shape.seq_len, config.seed)
        model.zero_grad(set_to_none=False)
        loss = lm_loss(model(inputs), targets)
        (loss + config.aux_weight * aux_loss_of(model)).backward()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(p.grad, alpha=-config.lr)
        losses.append(float(loss.detach()))
    for module in model.modules():  # the last forward's load-balancing losses hold its graph: let it go
        if isinstance(getattr(module, "aux_loss", None), torch.Tensor):
            module.aux_loss = torch.zeros(())
    return losses, model



def compare_with_oracle(result: Result, config: ComposedConfig,
                        oracle: tuple[list[float], torch.nn.Module] | None = None) -> dict[str, float]:
    """The largest differences from the oracle (`oracle_run(config)` unless given): in any step's loss and rank's slice."""
    losses, model = oracle if oracle is not None else oracle_run(config)
    ups = result.trace[result.trace.event == "update"].dropna(subset=["loss"])
    got = ups.groupby("step").loss.agg(["min", "max"])
    loss_diff = max(float(max(abs(got.loc[s, "min"] - want), abs(got.loc[s, "max"] - want)))
                    for s, want in enumerate(losses) if s in got.index)
    param_diff = 0.0
    for out in result.extras or []:
        part = build_part(model, config, detached_mesh(config.layout, out["coords"]))
        want = [p.detach().numpy() for p in part.parameters()]
        if len(want) != len(out["params"]):
            raise AssertionError(f"rank at {out['coords']}: {len(out['params'])} parameters, the oracle's slice "
                                 f"has {len(want)}")
        for w, g in zip(want, out["params"], strict=True):
            param_diff = max(param_diff, float(np.abs(w - g).max()))
    return {"loss": loss_diff, "params": param_diff, "steps": float(len(got)), "ranks": float(len(result.extras or []))}


_ORACLES: dict[tuple[Any, ...], tuple[list[float], torch.nn.Module]] = {}


def cached_oracle(config: ComposedConfig) -> tuple[list[float], torch.nn.Module]:
    """`oracle_run(config)`, remembered for the last two sets of what it depends on (layouts of one model and batch
    share it: a chapter of dense runs trains the single-process model once)."""
    key = (config.shape, config.seed, config.corpus_tokens, config.steps, config.batch, config.lr,
           config.aux_weight, config.groups if config.shape.experts else 0)
    if key not in _ORACLES:
        while len(_ORACLES) >= 2:
            del _ORACLES[next(iter(_ORACLES))]
        losses, model = oracle_run(config)
        model.zero_grad(set_to_none=True)
        _ORACLES[key] = (losses, model)
    return _ORACLES[key]
