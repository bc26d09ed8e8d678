"""`make assignments`: generate the student versions of the assignments with nbgrader into release/.

nbgrader's generate_assignment replaces every `### BEGIN SOLUTION ... ### END SOLUTION` region with a stub,
removes `### BEGIN HIDDEN TESTS ... ### END HIDDEN TESTS`, locks the test cells and records checksums; a note after the
first cell tells the student to run `dsgd-teach check` before submitting. It runs in a throw-away course directory (with its own gradebook), so the repository only gains release/<assignment>/.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat

from .notebook import HIDDEN_BEGIN, find_assignments
from .paths import default_source_dir


def generate(source_dir: Path, out_dir: Path, names: list[str] | None = None) -> list[Path]:
    """Release the named assignments (default: all) from source_dir into out_dir; returns the notebooks written."""
    sources = find_assignments(source_dir)
    names = names or sorted(sources)
    unknown = [n for n in names if n not in sources]
    if unknown:
        raise ValueError(f"unknown assignment(s) {unknown}; known: {', '.join(sources)}")
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    written = []
    with tempfile.TemporaryDirectory(prefix="dsgd-release-") as tmp:
        root = Path(tmp)
        for name in names:
            shutil.copytree(sources[name].parent, root / "source" / name,
                            ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
        # One nbgrader run for all of them: the assignment id is a glob over source/.
        cmd = [sys.executable, "-m", "nbgrader", "generate_assignment", "*", "--force",
               f"--CourseDirectory.root={root}", f"--CourseDirectory.db_url=sqlite:///{root / 'gradebook.db'}"]
        proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"nbgrader generate_assignment failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        for name in names:
            target = out_dir / name
            if target.exists():
                shutil.rmtree(target)
            shutil.copytree(root / "release" / name, target)
            for nb_path in sorted(target.glob("*.ipynb")):
                add_check_note(nb_path)
                _verify(nb_path)
                written.append(nb_path)
    return written


CHECK_NOTE = ("**Before you submit**, run `dsgd-teach check {name}` in a terminal: it runs this notebook's visible "
              "tests in the grader's own sandbox and prints which questions pass them, with each failing check's "
              "message. It needs only this notebook (keep its locked test cells as they are); instructors can "
              "check against the assignment sources with `--source DIR`. The hidden tests run only when your "
              "notebook is graded.")


def add_check_note(path: Path) -> None:
    """Put a markdown cell telling the student about `dsgd-teach check` after the notebook's first cell."""
    nb = nbformat.read(str(path), as_version=4)
    text = CHECK_NOTE.format(name=path.name)
    if not any(c.cell_type == "markdown" and c.source == text for c in nb.cells):
        nb.cells.insert(min(1, len(nb.cells)), nbformat.v4.new_markdown_cell(text))
        nbformat.write(nb, str(path))


def _verify(path: Path) -> None:
    """Refuse a release that still contains a solution or a hidden test."""
    text = path.read_text()
    for marker in ("### BEGIN SOLUTION", HIDDEN_BEGIN, "_ref_"):
        if marker in text:
            raise RuntimeError(f"{path} still contains {marker!r}; not releasing it")
    nbformat.validate(nbformat.read(str(path), as_version=4))


def main(argv: list[str]) -> int:
    """CLI for `make assignments`: python -m dsgd_teach.grading.release [NAME ...] [--source DIR] [--out DIR]."""
    p = argparse.ArgumentParser(prog="dsgd-teach assignments", description="Generate student notebooks with nbgrader.")
    p.add_argument("names", nargs="*", help="assignments to release (default: all)")
    p.add_argument("--source", type=Path, default=None, help="default: course/assignments/source")
    p.add_argument("--out", type=Path, default=Path("release"), help="default: release/")
    args = p.parse_args(argv)
    source = args.source or default_source_dir()
    if source is None or not source.is_dir():
        print("error: assignment sources not found; pass --source DIR", file=sys.stderr)
        return 2
    try:
        written = generate(source, args.out, args.names or None)
    except (ValueError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for path in written:
        print(f"released {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
