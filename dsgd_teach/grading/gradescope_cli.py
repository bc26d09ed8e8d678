"""`dsgd-teach gradescope ASSIGNMENT --out autograder.zip`: the assignment's autograder for Gradescope.

The zip holds, at its root as Gradescope's specification asks: `setup.sh` (run once when Gradescope builds the
image on its Ubuntu base: apt's python3, bubblewrap and util-linux, a virtualenv with the pinned versions of what
grading imports, this package copied to ROOT/lib, the sources closed to other users), `run_autograder` (run per
submission: `python -m dsgd_teach.grading.gradescope`), `requirements.txt`, `package/dsgd_teach/`, the source
notebook under `assignments/` (solutions and hidden tests: keep the zip private), and `dsgd_autograder.json`
(the assignment, limits, due date, late policy, extensions, resubmission limit and whether container mode is on).
`DSGD_AUTOGRADER_ROOT` moves /autograder elsewhere; `DSGD_AUTOGRADER_PYTHON` makes setup.sh use that Python
instead of building a virtualenv (both for testing the zip outside Gradescope).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import re
import sys
import zipfile
from pathlib import Path

from .cli import deadlines_args, policy_of
from .gradescope import CONFIG
from .notebook import find_assignments, load_assignment
from .paths import default_source_dir

GRADING_DISTRIBUTIONS = ("numpy", "nbformat", "nbclient", "jupyter_client", "ipykernel", "tqdm")

SETUP_SH = """#!/usr/bin/env bash
# Gradescope runs this once while it builds the autograder image (Ubuntu base; choose 24.04: Python >= 3.10).
set -euo pipefail
ROOT="${DSGD_AUTOGRADER_ROOT:-/autograder}"
SRC="$ROOT/source"
if [ -z "${DSGD_AUTOGRADER_PYTHON:-}" ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update
    apt-get install -y --no-install-recommends python3 python3-venv python3-pip bubblewrap util-linux
    python3 -m venv "$ROOT/venv"
    "$ROOT/venv/bin/pip" install --no-cache-dir -r "$SRC/requirements.txt"
    chmod -R a+rX "$ROOT/venv"
    PY="$ROOT/venv/bin/python"
else
    PY="$DSGD_AUTOGRADER_PYTHON"
fi
# The package, readable by the sandboxes' uids; the sources (solutions, hidden tests) by root only.
rm -rf "$ROOT/lib"
mkdir -p "$ROOT/lib"
cp -r "$SRC/package/dsgd_teach" "$ROOT/lib/"
chmod -R a+rX "$ROOT/lib"
chmod 755 "$ROOT"
chmod -R go-rwx "$SRC"
PYTHONPATH="$ROOT/lib" "$PY" -m dsgd_teach.grading.gradescope "$ROOT" --self-test
"""

RUN_AUTOGRADER = """#!/usr/bin/env bash
# Gradescope runs this for every submission: grade /autograder/submission/*.ipynb into results/results.json.
set -uo pipefail
ROOT="${DSGD_AUTOGRADER_ROOT:-/autograder}"
PY="${DSGD_AUTOGRADER_PYTHON:-$ROOT/venv/bin/python}"
cd "$ROOT"
PYTHONPATH="$ROOT/lib" exec "$PY" -m dsgd_teach.grading.gradescope "$ROOT"
"""


def requirements(notebook_text: str) -> list[str]:
    """Pinned `name==version` of what grading imports and of the installed packages the source notebook imports
    (a module named as its distribution, e.g. torch, scipy; others are left to the TA's requirements)."""
    names = set(GRADING_DISTRIBUTIONS)
    names.update(re.findall(r"^[ \t]*(?:from|import)[ \t]+([A-Za-z_]\w*)", notebook_text, re.M))
    pins = []
    for name in sorted(names - {"dsgd_teach"}, key=str.lower):
        try:
            pins.append(f"{name}=={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            continue
    return pins


def build(assignment: str, source_dir: Path, out: Path, config: dict) -> list[str]:
    """Write the autograder zip to out; returns the names it holds."""
    sources = find_assignments(source_dir)
    if assignment not in sources:
        raise ValueError(f"unknown assignment {assignment!r}; known: {', '.join(sources)}")
    load_assignment(sources[assignment])  # refuses a source without graded test cells
    package = Path(__file__).resolve().parents[1]
    folder = sources[assignment].parent
    out.parent.mkdir(parents=True, exist_ok=True)
    names = []
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        def add(name: str, data: bytes, mode: int = 0o644) -> None:
            info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr, info.compress_type = (0o100000 | mode) << 16, zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
            names.append(name)

        add("setup.sh", SETUP_SH.encode(), 0o755)
        add("run_autograder", RUN_AUTOGRADER.encode(), 0o755)
        add(CONFIG, json.dumps({**config, "assignment": assignment}, indent=2).encode())
        add("requirements.txt", ("\n".join(requirements(sources[assignment].read_text())) + "\n").encode())
        for path in sorted(package.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                add(f"package/dsgd_teach/{path.relative_to(package).as_posix()}", path.read_bytes())
        for path in sorted(folder.rglob("*")):
            if path.is_file() and ".ipynb_checkpoints" not in path.parts:
                add(f"assignments/{assignment}/{path.relative_to(folder).as_posix()}", path.read_bytes())
    return names


def main(argv: list[str]) -> int:
    """Build the zip; 0 on success, 2 on a usage error."""
    p = argparse.ArgumentParser(prog="dsgd-teach gradescope", description="Build a Gradescope autograder zip.")
    p.add_argument("assignment", help="assignment name, e.g. ps01_sgd")
    p.add_argument("--out", type=Path, default=Path("autograder.zip"), help="the zip to write")
    p.add_argument("--source", type=Path, default=None, help="assignment sources (default: course/assignments/source)")
    p.add_argument("--timeout", type=int, default=60, help="seconds per cell (default 60)")
    p.add_argument("--notebook-s", type=int, default=300, help="seconds per notebook run (default 300; Gradescope "
                   "runs the reference and the submission, so set its timeout above twice this)")
    p.add_argument("--memory-mb", type=int, default=1536, help="address-space limit per kernel (default 1536)")
    p.add_argument("--max-runs-per-day", type=int, default=None,
                   help="graded runs per student per 24 h; later runs report the last graded score")
    p.add_argument("--no-container-mode", action="store_true",
                   help="refuse to grade where bubblewrap cannot start, instead of using container mode")
    deadlines_args(p)
    args = p.parse_args(argv)
    source = args.source or default_source_dir()
    if source is None or not source.is_dir():
        print("error: assignment sources not found; pass --source DIR", file=sys.stderr)
        return 2
    try:
        policy = policy_of(args)
        if args.max_runs_per_day is not None and args.max_runs_per_day < 1:
            raise ValueError(f"--max-runs-per-day must be at least 1, got {args.max_runs_per_day}")
        config = {"container_mode": not args.no_container_mode, "max_runs_per_day": args.max_runs_per_day,
                  "limits": {"timeout_s": args.timeout, "memory_mb": args.memory_mb, "cpu_s": 600,
                             "notebook_s": args.notebook_s}}
        if policy is not None:
            config.update(due=policy.due.isoformat(), late_penalty=policy.penalty_per_day,
                          late_cutoff_days=policy.cutoff_days, extensions=dict(policy.extensions))
        names = build(args.assignment, source, args.out, config)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.out} ({len(names)} files): upload it as the assignment's autograder on Gradescope")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
