"""Execute every chapter headless on the embedded cluster into build/ (notebooks and HTML): `make course`."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

COURSE_DIR = Path(__file__).resolve().parent.parent / "course"


def chapters(course_dir: Path = COURSE_DIR) -> list[Path]:
    """The numbered chapter notebooks, in order (assignments live elsewhere)."""
    return sorted(p for p in course_dir.glob("[0-9][0-9]_*.ipynb"))


def execute(path: Path, out_dir: Path, timeout_s: int = 600, html: bool = True) -> float:
    """Run one notebook top to bottom; write the executed copy (and HTML) to out_dir; return seconds taken."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    t = time.perf_counter()
    client = NotebookClient(
        nb, timeout=timeout_s, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    )
    try:
        client.execute()
    finally:
        out_dir.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, out_dir / path.name)
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
    args = parser.parse_args(argv)
    if args.smoke:
        os.environ["DSGD_SMOKE"] = "1"
    todo = [p for p in chapters() if not args.only or any(p.name.startswith(o) for o in args.only)]
    failures, times = [], {}
    with tqdm(todo, unit="chapter") as bar:
        for path in bar:
            bar.set_description(path.stem)
            try:
                times[path.name] = execute(path, args.out)
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
