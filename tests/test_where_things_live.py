"""docs/code.md ("Where things live") and ARCHITECTURE.md name every module and sub-package of dsgd_teach, nothing else."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "dsgd_teach"


def where_things_live() -> str:
    """The page docs/code.md (the README's former section "Where things live")."""
    text = (ROOT / "docs" / "code.md").read_text()
    return text.split("# Where things live", 1)[1].split("\n## ", 1)[0]


def package_parts() -> tuple[set[str], set[str]]:
    """({top-level module file names}, {sub-package names}) of dsgd_teach."""
    modules = {p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py"}
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    return modules, packages


def named(text: str) -> tuple[set[str], set[str]]:
    """(backticked `x.py` names, backticked `x/` names) in text."""
    return set(re.findall(r"`([a-z_]+\.py)`", text)), set(re.findall(r"`([a-z_]+)/`", text))


def test_the_readme_names_every_module_and_sub_package():
    modules, packages = package_parts()
    said_modules, said_packages = named(where_things_live())
    assert not modules - said_modules, f"modules missing from docs/code.md: {sorted(modules - said_modules)}"
    assert not packages - said_packages, f"sub-packages missing there: {sorted(packages - said_packages)}"
    stale = said_modules - modules
    assert not stale, f"docs/code.md names modules dsgd_teach/ does not have: {sorted(stale)}"
    outside = {"dsgd_teach", "course", "tests", "binder", "solutions", "source"}
    assert not said_packages - packages - outside, sorted(said_packages - packages - outside)


def test_the_architecture_places_every_sub_package_and_names_only_real_files():
    text = (ROOT / "ARCHITECTURE.md").read_text()
    modules, packages = package_parts()
    said_modules, said_packages = named(text)
    assert not packages - said_packages, f"sub-packages ARCHITECTURE.md leaves out: {sorted(packages - said_packages)}"
    for path in re.findall(r"`([a-z_]+/[a-z_]+\.py)`", text):
        assert (PACKAGE / path).exists() or (ROOT / path).exists(), f"ARCHITECTURE.md names {path}, which does not exist"
    assert not said_modules - modules - {"__init__.py", "panel.py", "plots.py"}, sorted(said_modules - modules)
