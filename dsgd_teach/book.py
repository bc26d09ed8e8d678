"""The course as a static website (`make book`): the chapters as `make course` executed them, with the notation,
solutions, assignments and guide, built by Sphinx with MyST-NB and the book theme, offline."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat

from .book_check import broken_links, widgets_without_static
from .book_sources import ROOT, chapter_files, stage
from .course_runner import COURSE_DIR, execute

BOOK_DIR = ROOT / "book"  # conf.py, references.bib, static/

INDEX = """# Parallel and distributed SGD

A runnable course on parallel and distributed stochastic gradient descent: every chapter runs real
implementations on a live dask.distributed cluster. This book shows each chapter as it ran when the book was built,
figures and numbers included, with the machine and date on each page; open a chapter in JupyterLab (`make lab`, or
Binder) to run it yourself and use its widget panels.

Start with [the guide](guide.md) to install the course, read [the notation](NOTATION.md) once, then take the
chapters in order.

```{{toctree}}
:caption: Chapters
:maxdepth: 1

{chapters}
```

```{{toctree}}
:caption: Reference
:maxdepth: 1

NOTATION
bibliography
guide
```

```{{toctree}}
:caption: Guide pages
:maxdepth: 1
:glob:

docs/*
```

```{{toctree}}
:caption: Worked solutions
:maxdepth: 1
:glob:

solutions/*
```

```{{toctree}}
:caption: Graded assignments
:maxdepth: 1
:glob:

assignments/index
assignments/ps*
```
"""

BIBLIOGRAPHY = """# Bibliography

The papers the chapters cite; each citation in the book links here.

```{bibliography}
:all:
```
"""


def github_repo(url: str) -> str | None:
    """owner/name of a GitHub remote URL (https, ssh or scp-like), else None."""
    match = re.fullmatch(r"(?:https?://(?:[^@/]+@)?|ssh://git@|git@)github\.com[:/]([\w.-]+)/([\w.-]+?)(?:\.git)?/?",
                         url.strip())
    return f"{match.group(1)}/{match.group(2)}" if match else None


def default_binder_repo(root: Path = ROOT) -> str | None:
    """The repository every chapter's Binder link launches: BINDER_REPO when set, else the GitHub repository that
    `git remote get-url origin` names; None (local `make lab` links only) when neither is there."""
    if os.environ.get("BINDER_REPO"):
        return os.environ["BINDER_REPO"]
    try:
        done = subprocess.run(["git", "-C", str(root), "remote", "get-url", "origin"], capture_output=True, text=True,
                              timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return github_repo(done.stdout) if done.returncode == 0 else None


def chapters_without_static(executed_dir: Path, course: Path = COURSE_DIR) -> list[str]:
    """'chapter: cell ...' for each widget an executed chapter shows with no static copy beside it."""
    out = []
    for name in chapter_files(course).values():
        if (executed_dir / name).exists():
            nb = nbformat.read(executed_dir / name, as_version=4)
            out += [f"{name}: {problem}" for problem in widgets_without_static(nb)]
    return out


def stale_chapters(executed_dir: Path, course: Path = COURSE_DIR) -> list[Path]:
    """Chapters with no executed copy in executed_dir, or one older than the chapter itself."""
    out = []
    for name in chapter_files(course).values():
        done = executed_dir / name
        if not done.exists() or done.stat().st_mtime < (course / name).stat().st_mtime:
            out.append(course / name)
    return out


def write_sources(executed_dir: Path, src: Path, binder_repo: str | None = None) -> list[Path]:
    """Stage the course into src and add the index, bibliography page and .bib; return the chapter pages."""
    staged = stage(executed_dir, src, binder_repo)
    (src / "index.md").write_text(INDEX.format(chapters="\n".join(p.stem for p in staged)))
    (src / "bibliography.md").write_text(BIBLIOGRAPHY)
    shutil.copy(BOOK_DIR / "references.bib", src / "references.bib")
    return staged


def build(executed_dir: Path, out: Path, binder_repo: str | None = None, timeout_s: float = 900) -> Path:
    """Stage the sources under out/src and build the HTML into out/html; return the index page.

    Sphinx runs with warnings as errors, so an unresolved reference, citation or missing image fails the build.
    """
    src, html = out / "src", out / "html"
    write_sources(executed_dir, src, binder_repo)
    if html.exists():
        shutil.rmtree(html)
    cmd = [sys.executable, "-m", "sphinx", "-b", "html", "-q", "-W", "--keep-going", "-c", str(BOOK_DIR),
           "-d", str(out / "doctrees"), str(src), str(html)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise RuntimeError(f"sphinx-build failed ({done.returncode}):\n{done.stderr[-6000:]}")
    return html / "index.html"


def main(argv: list[str] | None = None) -> int:
    """Execute the chapters that have no fresh executed copy, then build the book."""
    parser = argparse.ArgumentParser(prog="python -m dsgd_teach.book", description=__doc__)
    parser.add_argument("--executed", type=Path, default=Path("build/course"), help="make course's output folder")
    parser.add_argument("--out", type=Path, default=Path("build/book"))
    parser.add_argument("--binder-repo", default=None,
                        help="GitHub owner/name for each chapter's Binder launch link (default: BINDER_REPO, else the "
                             "GitHub repository of `git remote get-url origin`; none: local `make lab` links only)")
    parser.add_argument("--smoke", action="store_true", help="execute missing chapters small (DSGD_SMOKE=1)")
    args = parser.parse_args(argv)
    if args.smoke:
        os.environ["DSGD_SMOKE"] = "1"
    t0 = time.perf_counter()
    failed = []
    for path in stale_chapters(args.executed):
        print(f"executing {path.name} (no fresh copy in {args.executed}/)", flush=True)
        try:
            execute(path, args.executed, html=False, snapshots=True)
        except Exception as exc:  # the executed copy, with its error, is written: build the book, then fail
            failed.append(path.name)
            print(f"FAILED {path.name}: {type(exc).__name__}: {str(exc)[-1000:]}", file=sys.stderr)
    t1 = time.perf_counter()
    binder_repo = args.binder_repo or default_binder_repo()
    index = build(args.executed, args.out, binder_repo)
    print(f"book built in {time.perf_counter() - t1:.1f} s (chapters executed: {t1 - t0:.1f} s): {index}")
    print(f"launch links: Binder for {binder_repo} and local `make lab`" if binder_repo else
          "launch links: local `make lab` only (no BINDER_REPO, no GitHub remote named origin)")
    problems = broken_links(index.parent)
    print("\n".join([*problems, f"link check: {len(problems)} broken internal link(s)"]))
    unshown = chapters_without_static(args.executed)
    print("\n".join([*unshown, f"static copies: {len(unshown)} widget(s) without one"]))
    problems += unshown
    if failed:
        print(f"{len(failed)} chapter(s) failed while executing: {', '.join(failed)}", file=sys.stderr)
    return 1 if problems or failed else 0


if __name__ == "__main__":
    sys.exit(main())
