"""The runtime beneath the rank loops, in three parts, each with its public face in its `__init__`:

- `clusters`: starting, finding and sizing the dask cluster a run gets (local, CLI-started, a gateway's, emulated
  hosts) and the workers a run needs from it;
- `ranks`: running one long task per rank on those workers, streaming its events, stopping it, and forming a
  torch.distributed group (or threads) around the ranks;
- `actors`: a rank's calls to a dask actor, which block, notice a stop request and time out loudly.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_face(package: str, names: dict[str, str]) -> Callable[[str], Any]:
    """A package's __getattr__ that imports each public name from its module (names: name -> module) on first use."""

    def __getattr__(name: str) -> Any:
        if name in names:
            return getattr(importlib.import_module(f"{package}.{names[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
