"""The package's import graph: no module imports itself back through others, none takes another's private names.

Every import counts, including those inside functions (they hide a cycle from Python at import time, not from
a reader). The graph is read from the source with ast, so nothing of the package is run.
"""

from __future__ import annotations

import ast
import re
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


# --- layers: imports point down the table of ARCHITECTURE.md -----------------------------------------------------

ARCHITECTURE = PACKAGE.parent / "ARCHITECTURE.md"
GRADING = "dsgd_teach.grading"

#: Upward imports allowed for now, each with its reason; ARCHITECTURE.md's "layer exceptions" table lists the same.
EXCEPTIONS = {
    ("dsgd_teach.{chapter}", "dsgd_teach.{chapter}.plots"):
        "a chapter package's `__init__.py` imports its `plots.py` for each experiment's default figure",
    ("dsgd_teach.collectives", "dsgd_teach.plots"):
        "chapter 05's `__init__.py` draws its comparison with the shared `compare` figure",
    ("dsgd_teach.sim.pipeline", "dsgd_teach.pipeline.plots"):
        "the simulated pipeline draws its schedule with chapter 08's figure",
    ("dsgd_teach.syncasync.playground", "dsgd_teach.panel"):
        "the playground's config, run and panel still share one file",
    ("dsgd_teach.syncasync.playground", "dsgd_teach.syncasync.plots"):
        "the playground's config, run and panel still share one file",
}


def _pattern(text: str) -> str:
    """A shell-style module pattern as a regex: `*` matches anything (dots too), `{chapter}` one package name."""
    out = re.escape(text).replace(r"\*", ".*")
    return out.replace(r"\{chapter\}", "(?P<chapter>[a-z_]+)", 1).replace(r"\{chapter\}", "(?P=chapter)")


def _table(text: str, marker: str) -> list[list[list[str]]]:
    """The rows of the markdown table between `<!-- marker... -->` and `<!-- /marker -->`, each cell's `code` items."""
    body = text.split(f"<!-- {marker}", 1)[1].split(f"<!-- /{marker} -->", 1)[0]
    rows = [line.strip().strip("|").split("|") for line in body.splitlines()[1:] if line.startswith("|")]
    return [[re.findall(r"`([^`]+)`", cell) for cell in row[:-1]] + [[row[-1].strip()]] for row in rows[2:]]


def read_layers(text: str) -> tuple[list[tuple[str, str]], dict[tuple[str, str], str]]:
    """ARCHITECTURE.md's ([(pattern, layer), ...] in order, {(importer, imported): why})."""
    rules = [(pattern, layer) for patterns, [layer] in _table(text, "layers") for pattern in patterns]
    exceptions = {(a, b): why for importers, imported, [why] in _table(text, "layer exceptions")
                  for a in importers for b in imported}
    return rules, exceptions


def layer_of(module: str, rules: list[tuple[str, str]]) -> str | None:
    """The layer ("0".."5" or "apart") of the first pattern the module matches; None if none does."""
    return next((layer for pattern, layer in rules if re.fullmatch(_pattern(pattern), module)), None)


def defining_edges(root: Path) -> set[tuple[str, str]]:
    """(importer, module) pairs as import_edges reads them, except that a name taken from a package's __init__, which
    the __init__ imports at its top from one of the package's modules, counts as imported from that module."""
    files = {module_name(p, root): p for p in root.rglob("*.py")}
    faces: dict[str, dict[str, str]] = {}  # package -> {name its __init__ imports from one of its modules: module}
    for name, path in files.items():
        if path.name == "__init__.py":
            faces[name] = {a.asname or a.name: f"{name}.{node.module}" for node in ast.parse(path.read_text()).body
                           if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module
                           and f"{name}.{node.module}" in files for a in node.names}
    edges: set[tuple[str, str]] = set()
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                edges |= {(name, a.name) for a in node.names if a.name in files}
            elif isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                target = ".".join(base + ([node.module] if node.module else []))
                for alias in node.names:
                    if f"{target}.{alias.name}" in files:  # `from . import module`
                        edges.add((name, f"{target}.{alias.name}"))
                    elif target in files:
                        edges.add((name, faces.get(target, {}).get(alias.name, target)))
    return {(a, b) for a, b in edges if a != b}


def upward_imports(root: Path, text: str) -> tuple[list[str], set[tuple[str, str]]]:
    """(["importer (layer) -> imported (layer)", ...] not excused, the exceptions that were used)."""
    rules, exceptions = read_layers(text)
    wrong, used = [], set()
    for a, b in sorted(defining_edges(root)):
        la, lb = layer_of(a, rules), layer_of(b, rules)
        if la is None or lb is None:
            wrong.append(f"{a if la is None else b}: no layer in ARCHITECTURE.md")
            continue
        if la == lb or (lb != "apart" and la != "apart" and int(lb) < int(la)) or (lb == "apart" and la == "5"):
            continue
        if la == "apart" and b == "dsgd_teach":  # the package's location, to find it inside a sandbox
            continue
        excuse = next((key for key in exceptions if re.fullmatch(_pattern(" -> ".join(key)), f"{a} -> {b}")), None)
        if excuse:
            used.add(excuse)
        else:
            wrong.append(f"{a} ({la}) -> {b} ({lb})")
    return wrong, used


def test_the_layer_checker_sees_an_upward_import_and_a_name_through_a_face(tmp_path):
    """Not blind: a foundation importing the runtime is caught; a name from a package's face counts from its module."""
    root = _package(tmp_path, {
        "base.py": "from .run import go\n", "run.py": "",
        "chap/__init__.py": "from .algo import step\nfrom .plots import draw\n", "chap/algo.py": "",
        "chap/plots.py": "", "other/__init__.py": "", "other/algo.py": "from ..chap import step\n",
    })  # fmt: skip
    text = ("<!-- layers -->\n| pattern | layer |\n| --- | --- |\n| `pkg.base` | 0 |\n| `pkg.run` | 1 |\n"
            "| `pkg.*.plots` | 4 |\n| `pkg.chap`, `pkg.other` | 3 |\n| `pkg.*` | 2 |\n| `pkg` | 5 |\n<!-- /layers -->\n"
            "<!-- layer exceptions -->\n| importer | imported | why |\n| --- | --- | --- |\n"
            "| `pkg.{chapter}` | `pkg.{chapter}.plots` | default figure |\n<!-- /layer exceptions -->\n")
    wrong, used = upward_imports(root, text)
    assert ("pkg.other.algo", "pkg.chap.algo") in defining_edges(root)
    assert wrong == ["pkg.base (0) -> pkg.run (1)"]
    assert used == {("pkg.{chapter}", "pkg.{chapter}.plots")}


def test_imports_point_down_the_layers_of_architecture_md():
    wrong, used = upward_imports(PACKAGE, ARCHITECTURE.read_text())
    assert not wrong, "imports that point up the layers of ARCHITECTURE.md: " + "; ".join(wrong)
    stale = sorted(set(EXCEPTIONS) - used)
    assert not stale, f"exceptions that no longer happen (remove them here and in ARCHITECTURE.md): {stale}"


def test_the_exceptions_are_listed_in_both_places_with_their_reasons():
    _, listed = read_layers(ARCHITECTURE.read_text())
    assert listed == EXCEPTIONS, (
        f"ARCHITECTURE.md lists {sorted(listed.items())}, the test {sorted(EXCEPTIONS.items())}")


def test_the_grading_package_names_none_of_the_courses_modules():
    """Neither an import nor a string: `dsgd_teach.runtime...` written anywhere in grading/ is a dependency too."""
    files = {module_name(p, PACKAGE) for p in PACKAGE.rglob("*.py")}
    named = []
    for path in sorted((PACKAGE / "grading").rglob("*")):
        if path.is_file() and path.suffix in {".py", ".md", ".json", ".txt", ".sh", ".toml"}:
            for match in re.finditer(r"dsgd_teach(?:\.\w+)+", path.read_text()):
                parts = match.group(0).split(".")
                modules = [".".join(parts[:i]) for i in range(2, len(parts) + 1) if ".".join(parts[:i]) in files]
                if modules and not modules[0].startswith(GRADING):
                    named.append(f"{path.relative_to(PACKAGE.parent)}: {match.group(0)}")
    assert not named, "the grading package names the course's modules: " + "; ".join(named)
