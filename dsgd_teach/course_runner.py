"""Execute every chapter headless on the embedded cluster into build/ (notebooks and HTML): `make course`."""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

COURSE_DIR = Path(__file__).resolve().parent.parent / "course"


def chapters(course_dir: Path = COURSE_DIR) -> list[Path]:
    """The numbered chapter notebooks, in order (assignments live elsewhere)."""
    return sorted(p for p in course_dir.glob("[0-9][0-9]_*.ipynb"))


def machine_description() -> str:
    """This machine in one line: processor, cores, memory, OS, Python and torch (what produced a chapter's numbers)."""
    import psutil

    from .machine import cpu_count

    model = platform.processor() or platform.machine()
    try:
        model = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    try:
        from importlib.metadata import version

        torch = f", torch {version('torch')}"
    except Exception:  # no torch metadata: say nothing rather than guess
        torch = ""
    return (f"{model}, {cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB, {platform.system()} "
            f"{platform.release()}, Python {platform.python_version()}{torch}")


def record_run(nb: Any, started: datetime, seconds: float) -> None:
    """Note in an executed notebook's metadata when, where, in which mode and how long it ran."""
    nb.metadata["dsgd_teach"] = {
        "executed_at": started.strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine_description(),
        "mode": "smoke" if os.environ.get("DSGD_SMOKE") == "1" else "full",
        "seconds": round(seconds, 1),
    }


def write_executed(nb: Any, target: Path) -> None:
    """Write an executed notebook whole, then rename it into place: a reader never sees half a file."""
    import nbformat

    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.part")
    nbformat.write(nb, partial)
    os.replace(partial, target)


def execute(path: Path, out_dir: Path, timeout_s: int = 600, html: bool = True, snapshots: bool = False) -> float:
    """Run one notebook top to bottom; write the executed copy (and HTML) to out_dir; return seconds taken.

    With snapshots, every widget panel the chapter builds also runs once and leaves a static figure (panel.py's
    SNAPSHOT_ENV); the copy's metadata records when, where and in which mode it ran.
    """
    import nbformat
    from nbclient import NotebookClient

    from .static_copy import SNAPSHOT_ENV

    nb = nbformat.read(path, as_version=4)
    t = time.perf_counter()
    started = datetime.now(timezone.utc)
    client = NotebookClient(
        nb, timeout=timeout_s, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    )
    env = {**os.environ, SNAPSHOT_ENV: "1" if snapshots else "0"}
    try:
        client.execute(env=env)
    finally:
        record_run(nb, started, time.perf_counter() - t)
        write_executed(nb, out_dir / path.name)
        if html:
            from nbconvert import HTMLExporter

            body, _ = HTMLExporter().from_notebook_node(nb)
            (out_dir / path.with_suffix(".html").name).write_text(body, encoding="utf-8")
    return time.perf_counter() - t


def main(argv: list[str] | None = None) -> int:
    """Execute the chapters with a progress bar; non-zero exit if any fails."""
    from tqdm import tqdm

    parser = argparse.ArgumentParser(prog="python -m dsgd_teach.course_runner", description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("build/course"))
    parser.add_argument("--smoke", action="store_true", help="small data, few steps (sets DSGD_SMOKE=1)")
    parser.add_argument("--only", nargs="*", default=None, help="chapter numbers or names to run, e.g. 00 01")
    parser.add_argument("--notebooks-only", action="store_true",
                        help="write the executed notebooks only: no HTML pages, no panel snapshots (a check's run)")
    args = parser.parse_args(argv)
    if args.smoke:
        os.environ["DSGD_SMOKE"] = "1"
    todo = [p for p in chapters() if not args.only or any(p.name.startswith(o) for o in args.only)]
    failures, times = [], {}
    with tqdm(todo, unit="chapter") as bar:
        for path in bar:
            bar.set_description(path.stem)
            try:
                times[path.name] = execute(path, args.out, html=not args.notebooks_only,
                                           snapshots=not args.notebooks_only)
            except Exception as exc:
                failures.append(path.name)
                tqdm.write(f"FAILED {path.name}: {type(exc).__name__}: {str(exc)[-2000:]}")
    for name, seconds in times.items():
        print(f"  {name:<32} {seconds:6.1f} s")
    print(f"executed notebooks and HTML in {args.out}/")
    if failures:
        print(f"{len(failures)} chapter(s) failed: {', '.join(failures)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
