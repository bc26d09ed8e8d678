"""The package's import graph: no module imports itself back through others, none takes another's private names.

Every import counts, including those inside functions (they hide a cycle from Python at import time, not from
a reader). The graph is read from the source with ast, so nothing of the package is run.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "dsgd_teach"


def module_name(path: Path, root: Path) -> str:
    """dsgd_teach/a/b.py -> dsgd_teach.a.b; dsgd_teach/a/__init__.py -> dsgd_teach.a."""
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_edges(root: Path) -> tuple[dict[str, set[str]], list[str]]:
    """(module -> modules of the package it imports, ["module: from X import _private", ...])."""
    files = {module_name(p, root): p for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in files}
    private: list[str] = []
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                graph[name] |= {a.name for a in node.names if a.name in files}
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                for alias in node.names:
                    if f"{target}.{alias.name}" in files:  # `from . import module`
                        graph[name].add(f"{target}.{alias.name}")
                    elif target in files:
                        graph[name].add(target)
                        if alias.name.startswith("_") and not alias.name.startswith("__") and target != name:
                            private.append(f"{name}: from {target} import {alias.name}")
    for name in graph:
        graph[name].discard(name)
    return graph, private


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "pkg"
    for rel, text in {"__init__.py": "", **files}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_the_checker_sees_a_cycle_through_a_function_level_import_and_a_private_name(tmp_path):
    """Not blind: a -> b at the top, b -> a inside a function, and a private name taken across modules."""
    root = _package(tmp_path, {
        "a.py": "from .b import helper\n",
        "b.py": "def helper():\n    from .a import _secret\n    return _secret\n",
        "sub/__init__.py": "", "sub/c.py": "from .. import a\nfrom ..sub import d\n", "sub/d.py": "",
    })  # fmt: skip
    graph, private = import_edges(root)
    assert graph["pkg.sub.c"] == {"pkg.a", "pkg.sub.d"}
    assert cycles(graph) == [["pkg.a", "pkg.b"]]
    assert private == ["pkg.b: from pkg.a import _secret"]


def test_the_package_has_no_import_cycle():
    graph, _ = import_edges(PACKAGE)
    assert sum(len(v) for v in graph.values()) > 100, "the graph reader found almost no imports"
    found = cycles(graph)
    assert not found, "modules that import each other (directly or through others): " + "; ".join(
        " <-> ".join(c) for c in found)


def test_no_module_imports_another_modules_private_names():
    _, private = import_edges(PACKAGE)
    assert not private, "private names imported across modules: " + "; ".join(private)
