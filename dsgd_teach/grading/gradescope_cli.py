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
import ast
import functools
import importlib.metadata
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import nbformat

from .cli import deadlines_args, policy_of
from .gradescope import CONFIG
from .kernel import WARMABLE
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
# Grade the reference solution once: an image that cannot grade (a module missing) fails here, while it is built.
cd "$ROOT"
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


#: Where the CPU-only torch wheels are (the project pins torch and installs the +cpu build: docs/install.md);
#: Gradescope has no GPU, and PyPI's torch wheel would pull gigabytes of CUDA libraries into the image.
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
CUDA_ONLY = ("nvidia-", "triton")  # distributions only a CUDA torch build needs

# Run by `requirements` in a child interpreter: import each module named in argv[1] (a JSON list), then print the
# top-level names of every module loaded, as JSON (a module that does not import here is skipped).
_LOADED = """
import importlib, json, sys
for name in json.loads(sys.argv[1]):
    try:
        importlib.import_module(name)
    except Exception:
        pass
print(json.dumps(sorted({m.split(".")[0] for m in list(sys.modules)})))
"""


def code_imports(notebook: Any) -> set[str]:
    """The modules (dotted, absolute) that the notebook's code cells import: parsed, IPython magics and shell
    lines dropped; a cell that does not parse is read line by line."""
    found: set[str] = set()
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        lines = [line for line in cell.source.splitlines() if not line.lstrip().startswith(("%", "!"))]
        try:
            tree = ast.parse("\n".join(lines))
        except SyntaxError:
            for line in lines:
                m = re.match(r"[ \t]*(?:from[ \t]+([\w.]+)[ \t]+import|import[ \t]+([\w.]+))", line)
                if m and not (m.group(1) or "").startswith("."):
                    found.add(m.group(1) or m.group(2))
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.add(node.module)
    return found


@functools.lru_cache(maxsize=32)
def distributions_loaded_by(modules: frozenset[str]) -> frozenset[str]:
    """The installed distributions whose modules importing `modules` loads (transitively: e.g. the course's
    runtime loads torch, tqdm), computed in a child interpreter of this Python."""
    proc = subprocess.run([sys.executable, "-c", _LOADED, json.dumps(sorted(modules))], capture_output=True,
                          text=True, timeout=600, check=True)
    owners = importlib.metadata.packages_distributions()
    return frozenset(dist for top in json.loads(proc.stdout.strip().splitlines()[-1]) for dist in owners.get(top, ()))


def requirements(notebook: Any) -> list[str]:
    """requirements.txt's lines for grading this notebook: pinned `name==version` of what the grader imports, of
    the modules the grading kernel pre-imports (dsgd_teach.GRADING_PREIMPORT, kernel.WARMABLE) and of every
    installed distribution that the notebook's code cells load; torch as the CPU build from PyTorch's CPU index.
    Modules not installed here are left to the TA's own requirements."""
    names = set(GRADING_DISTRIBUTIONS) | distributions_loaded_by(frozenset(code_imports(notebook) |
                                                                           set(WARMABLE.values())))
    pins, index = [], []
    for name in sorted(names, key=str.lower):
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        canonical = dist.metadata["Name"]
        if canonical.lower().replace("_", "-") == "dsgd-teach" or canonical.lower().startswith(CUDA_ONLY):
            continue
        if canonical.lower() == "torch":
            pins.append(f"torch=={dist.version.split('+')[0]}+cpu")
            index = [f"--extra-index-url {TORCH_CPU_INDEX}"]
        else:
            pins.append(f"{canonical}=={dist.version}")
    return index + sorted(set(pins), key=str.lower)


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
        notebook = nbformat.read(str(sources[assignment]), as_version=4)
        add("requirements.txt", ("\n".join(requirements(notebook)) + "\n").encode())
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
        # Without --due, the due date is Gradescope's own (submission_metadata.json's assignment.due_date, read
        # per run); the penalty, cutoff and extensions given here apply to it.
        late_only = args.due is None and bool(args.late_penalty or args.late_cutoff_days is not None or
                                              args.extensions is not None)
        if late_only:
            args.due = "1970-01-01T00:00+00:00"  # a stand-in, to check the values and read the extensions
        policy = policy_of(args)
        if args.max_runs_per_day is not None and args.max_runs_per_day < 1:
            raise ValueError(f"--max-runs-per-day must be at least 1, got {args.max_runs_per_day}")
        config = {"container_mode": not args.no_container_mode, "max_runs_per_day": args.max_runs_per_day,
                  "limits": {"timeout_s": args.timeout, "memory_mb": args.memory_mb, "cpu_s": 600,
                             "notebook_s": args.notebook_s}}
        if policy is not None:
            config.update(due=None if late_only else policy.due.isoformat(), late_penalty=policy.penalty_per_day,
                          late_cutoff_days=policy.cutoff_days, extensions=dict(policy.extensions))
        names = build(args.assignment, source, args.out, config)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.out} ({len(names)} files): upload it as the assignment's autograder on Gradescope")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
