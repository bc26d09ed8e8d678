"""The registry of runnable experiments: the CLI, the widget panels and the benchmarks look them up here.

Each chapter package exposes EXPERIMENTS = {name: Experiment(...)}; this module gathers them, so adding a chapter
never means editing a central list of functions, only the tuple of chapter packages below.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from distributed import Client

from .config import Config
from .trace import OnUpdate, Result

CHAPTER_PACKAGES = (
    "dsgd_teach.sgd",
    "dsgd_teach.hogwild",
    "dsgd_teach.ps",
    "dsgd_teach.syncasync",
    "dsgd_teach.collectives",
    "dsgd_teach.threads",
    "dsgd_teach.pipeline",
    "dsgd_teach.tensor_parallel",
    "dsgd_teach.averaging",
    "dsgd_teach.sharded",
    "dsgd_teach.transformer",
    "dsgd_teach.sim",
)


@dataclass(frozen=True)
class Experiment:
    """A named experiment: its config class, its run function, a one-line description, and a default plot."""

    name: str
    config_cls: type[Config]
    run: Callable[[Any, Client, OnUpdate | None], Result]
    description: str
    plot: Callable[..., Any] | None = None
    needs_cluster: bool = True  # False for experiments that run in-process (the simulator)


def registry() -> dict[str, Experiment]:
    """All experiments of the chapters that are installed, by name."""
    found: dict[str, Experiment] = {}
    for package in CHAPTER_PACKAGES:
        try:
            module = importlib.import_module(package)
        except ModuleNotFoundError as exc:
            if exc.name == package:
                continue
            raise
        found.update(getattr(module, "EXPERIMENTS", {}))
    return found


def get(name: str) -> Experiment:
    """The experiment called name, or a ValueError listing the known ones."""
    known = registry()
    if name not in known:
        raise ValueError(f"unknown experiment {name!r}; known: {', '.join(sorted(known))}")
    return known[name]
