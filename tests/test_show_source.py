"""What the chapters show besides their runs: the source of the algorithm each one runs, and worked solutions.

Every chapter calls `show_source` on the function (or class) that executes its core algorithm, right where it runs
it; the name resolves through the chapter's own imports and the text shown is exactly `inspect.getsource`'s.
Every chapter's ungraded exercises link to a solutions file in course/solutions/ whose code blocks compile and
import only names that exist. These tests read the notebooks and import the package; they start no cluster.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

import nbformat
import pytest

from dsgd_teach.show import show_source, source_header

ROOT = Path(__file__).resolve().parents[1]
COURSE = ROOT / "course"
SOLUTIONS = COURSE / "solutions"
CHAPTERS = sorted(COURSE.glob("[0-9][0-9]_*.ipynb"))


def python_of(source: str) -> str:
    """A notebook cell's source with IPython's magics and shell escapes turned into blank lines."""
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())


def code_cells(path: Path) -> list[ast.Module]:
    """The parsed code cells of one chapter."""
    nb = nbformat.read(path, as_version=4)
    return [ast.parse(python_of(c.source)) for c in nb.cells if c.cell_type == "code"]


def shown(tree: ast.Module) -> list[ast.expr]:
    """The argument of every show_source(...) call in a parsed cell."""
    return [
        node.args[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "show_source"
        and node.args
    ]


def chapter_namespace(trees: list[ast.Module]) -> dict:
    """The names a chapter imports, obtained by executing only its import statements."""
    namespace: dict = {}
    for tree in trees:
        imports = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
        exec(compile(ast.Module(body=imports, type_ignores=[]), "<chapter imports>", "exec"), namespace)
    return namespace


def test_the_chapters_are_all_here():
    numbers = [p.name[:2] for p in CHAPTERS]
    assert numbers[:10] == [f"{i:02d}" for i in range(10)] and len(set(numbers)) == len(numbers), numbers
    assert CHAPTERS[-1].name == "11_at_scale.ipynb", "the at-scale chapter closes the course"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_shows_the_source_it_runs(path):
    trees = code_cells(path)
    targets = [arg for tree in trees for arg in shown(tree)]
    assert targets, f"{path.name}: no show_source(...) cell shows the algorithm the chapter runs"
    namespace = chapter_namespace(trees)
    for arg in targets:
        expr = ast.unparse(arg)
        obj = eval(compile(ast.Expression(arg), "<show_source argument>", "eval"), namespace)
        module = inspect.getmodule(inspect.unwrap(obj))
        assert module is not None and module.__name__.startswith("dsgd_teach."), f"{path.name}: {expr} is not ours"
        shown_text = show_source(obj).data
        header, _, body = shown_text.partition("\n")
        assert body == inspect.getsource(obj), f"{path.name}: show_source({expr}) is not the source that runs"
        assert header == source_header(obj)


def test_show_source_is_getsource_under_a_header_with_the_right_lines():
    from dsgd_teach.sgd.sequential import sgd_steps
    from dsgd_teach.syncasync.schedule import StalenessGate

    for obj in (sgd_steps, StalenessGate, StalenessGate.can_write):
        code = show_source(obj)
        assert code.language == "python"
        header, _, body = code.data.partition("\n")
        assert body == inspect.getsource(obj)
        m = re.fullmatch(r"# (\S+)  \((\S+), lines (\d+)-(\d+)\)", header)
        assert m, header
        assert m.group(1) == f"{obj.__module__}.{obj.__qualname__}"
        lines = (ROOT / m.group(2)).read_text().splitlines(keepends=True)
        assert "".join(lines[int(m.group(3)) - 1 : int(m.group(4))]) == body


def test_show_source_reads_through_numba_kernels():
    from dsgd_teach.hogwild.kernels import sparse_sgd

    body = show_source(sparse_sgd).data.partition("\n")[2]
    assert body.startswith("@njit") and "def sparse_sgd(" in body


# --- solutions to the ungraded exercises ---------------------------------------------------------------------

FENCE = re.compile(r"```python\n(.*?)```", re.S)
LINK = re.compile(r"solutions/(\d\d_[a-z_]+_solutions\.md)")


def exercise_cells(path: Path) -> list[str]:
    """The markdown cells of a chapter that set exercises."""
    nb = nbformat.read(path, as_version=4)
    return [c.source for c in nb.cells if c.cell_type == "markdown" and re.search(r"^#+ Exercises?\b", c.source, re.M)]


def solutions_file(path: Path) -> Path:
    """Where a chapter's worked solutions live."""
    return SOLUTIONS / f"{path.stem}_solutions.md"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_exercises_link_their_solutions(path):
    cells = exercise_cells(path)
    assert cells, f"{path.name}: no Exercises section"
    for cell in cells:
        assert solutions_file(path).name in LINK.findall(cell), f"{path.name}: the exercises do not link solutions"
    text = solutions_file(path).read_text(encoding="utf-8")
    numbered = re.findall(r"^\s*(\d+)\. ", "\n".join(cells), re.M)
    for n in numbered:
        assert re.search(rf"^## Exercise {n}\b", text, re.M), f"{solutions_file(path).name}: no solution to {n}"


def imported_names(tree: ast.Module) -> list[tuple[str, str | None]]:
    """(module, name) for every import in a parsed block; name None for `import module`."""
    out: list[tuple[str, str | None]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            out += [(node.module or "", a.name) for a in node.names]
    return out


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_solution_code_compiles_and_imports_what_exists(path):
    text = solutions_file(path).read_text(encoding="utf-8")
    for i, block in enumerate(FENCE.findall(text)):
        tree = ast.parse(python_of(block))
        compile(tree, f"{solutions_file(path).name} block {i}", "exec")
        for module, name in imported_names(tree):
            imported = importlib.import_module(module)
            if name is not None and not hasattr(imported, name):
                importlib.import_module(f"{module}.{name}")  # a submodule not yet imported by its package


def test_a_missing_name_is_caught():
    tree = ast.parse("from dsgd_teach.sgd import no_such_function")
    (module, name), = imported_names(tree)
    with pytest.raises(ModuleNotFoundError):
        imported = importlib.import_module(module)
        if not hasattr(imported, name):
            importlib.import_module(f"{module}.{name}")
