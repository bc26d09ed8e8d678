"""Show, in a chapter, the source of the function that the chapter runs: the code a learner reads is the code that runs."""

from __future__ import annotations

import inspect
from typing import Any

from IPython.display import Code


def source_header(obj: Any) -> str:
    """One comment line naming where obj is defined: '# module.qualname  (path/to/file.py, lines a-b)'."""
    target = inspect.unwrap(obj)
    lines, first = inspect.getsourcelines(target)
    module = getattr(target, "__module__", None) or inspect.getmodule(target).__name__
    name = getattr(target, "__qualname__", getattr(target, "__name__", repr(target)))
    path = inspect.getsourcefile(target) or "?"
    marker = "dsgd_teach/"
    short = path[path.rfind(marker):] if marker in path else path
    return f"# {module}.{name}  ({short}, lines {first}-{first + len(lines) - 1})"


def show_source(obj: Any) -> Code:
    """Syntax-highlighted source of obj (function, method or class) under a one-line header naming its file and lines."""
    source = inspect.getsource(inspect.unwrap(obj))
    return Code(f"{source_header(obj)}\n{source}", language="python")
