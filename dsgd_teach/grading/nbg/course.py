"""Set up an nbgrader course directory that grades through dsgd-teach, and run nbgrader commands in it.

    python -m dsgd_teach.grading.nbg.course COURSE_DIR --course-id dsgd --exchange /srv/nbgrader/exchange

copies the assignment sources into COURSE_DIR/source/ and writes COURSE_DIR/nbgrader_config.py: the repository's
`course/assignments/nbgrader_config.py` (which routes autograde and feedback through dsgd-teach) followed by this
course's id, exchange folder and a release folder inside the course.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

from ..notebook import find_assignments
from ..paths import default_source_dir

ROUTE_CONFIG = Path(__file__).resolve().parents[3] / "course" / "assignments" / "nbgrader_config.py"


def write_config(root: Path, course_id: str, exchange: Path | None) -> Path:
    """COURSE_DIR/nbgrader_config.py: the dsgd-teach route plus this course's id, exchange and folders."""
    if not ROUTE_CONFIG.is_file():
        raise FileNotFoundError(f"{ROUTE_CONFIG} not found; run from a checkout of dsgd-teach")
    lines = [ROUTE_CONFIG.read_text(), "", "# This course (written by dsgd_teach.grading.nbg.course)",
             f"c.CourseDirectory.root = {str(root.resolve())!r}",
             'c.CourseDirectory.release_directory = "release"',
             f"c.CourseDirectory.course_id = {course_id!r}"]
    if exchange is not None:
        lines.append(f"c.Exchange.root = {str(exchange.resolve())!r}")
    path = root / "nbgrader_config.py"
    path.write_text("\n".join(lines) + "\n")
    return path


def make_course(root: Path, course_id: str, exchange: Path | None, names: list[str] | None = None,
                source_dir: Path | None = None) -> list[str]:
    """Create (or refresh) a course directory with the named assignments' sources; returns their names."""
    source_dir = source_dir or default_source_dir()
    if source_dir is None:
        raise FileNotFoundError("course/assignments/source not found; pass --source")
    sources = find_assignments(source_dir)
    names = names or sorted(sources)
    unknown = [n for n in names if n not in sources]
    if unknown:
        raise ValueError(f"unknown assignment(s) {unknown}; known: {', '.join(sources)}")
    root.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copytree(sources[name].parent, root / "source" / name, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
    if exchange is not None:
        exchange.mkdir(parents=True, exist_ok=True)
    write_config(root, course_id, exchange)
    return names


def nbgrader(root: Path, *args: str, timeout_s: float = 900, env: dict[str, str] | None = None,
             ) -> subprocess.CompletedProcess[str]:
    """Run `nbgrader ARGS` in the course directory with this Python (output captured, never hangs)."""
    base = {**os.environ, **(env or {})}
    base["PATH"] = os.path.dirname(sys.executable) + os.pathsep + base.get("PATH", "")
    return subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=root, env=base, capture_output=True,
                          text=True, timeout=timeout_s)


def main(argv: list[str]) -> int:
    """CLI: create a course directory wired to the dsgd-teach route."""
    p = argparse.ArgumentParser(prog="python -m dsgd_teach.grading.nbg.course",
                                description="Create an nbgrader course directory that grades through dsgd-teach.")
    p.add_argument("root", type=Path, help="the course directory (created if missing)")
    p.add_argument("--course-id", required=True, help="nbgrader course id (students see it in the Assignments tab)")
    p.add_argument("--exchange", type=Path, default=None, help="nbgrader exchange folder (default: nbgrader's own)")
    p.add_argument("--source", type=Path, default=None, help="assignment sources (default: course/assignments/source)")
    p.add_argument("names", nargs="*", help="assignments to copy (default: all)")
    args = p.parse_args(argv)
    try:
        names = make_course(args.root, args.course_id, args.exchange, args.names or None, args.source)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"course {args.course_id!r} in {args.root}: {', '.join(names)}; config {args.root / 'nbgrader_config.py'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
