#!/usr/bin/env bash
# The newcomer's configuration, checked by `make test`: the newest other supported Python on this machine with
# PyPI's standard torch wheel (the CUDA build plain `pip install` gives on Linux), in .venv-compat. Runs every
# chapter in smoke mode on a CLI deployment, and the oracle and memory tests there. Skips, saying why, where no
# second Python exists. Usage: scripts/compat_test.sh MAIN_PYTHON [pytest args...]; COMPAT_PYTHON=/path/to/python3.10 picks another
# interpreter and COMPAT_VENV another folder (how the other supported Pythons are checked by hand).
# With --install-only first, it only builds the environment (make test runs the whole script beside the main suite).
set -euo pipefail
cd "$(dirname "$0")/.."
install_only=false
if [ "${1:-}" = "--install-only" ]; then install_only=true; shift; fi
main_python=${1:?usage: scripts/compat_test.sh [--install-only] MAIN_PYTHON}
shift
main_version=$("$main_python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if [ -n "${COMPAT_PYTHON:-}" ]; then
  python=$COMPAT_PYTHON
elif ! python=$(scripts/newest_python.sh "$main_version"); then
  echo "compat: SKIPPED: no supported Python (3.10-3.13) other than the main environment's $main_version on this machine"
  exit 0
fi
venv=${COMPAT_VENV:-.venv-compat}
version=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if [ ! -f "$venv/.installed" ] || [ pyproject.toml -nt "$venv/.installed" ] || \
   [ "$("$venv/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" != "$version" ]; then
  rm -rf "$venv"
  echo "compat: installing Python $version ($python) with PyPI's torch wheel into $venv (about 2.7 GB to download)"
  start=$(date +%s)
  "$python" -m venv "$venv"
  # what a newcomer's `pip install` gives, plus pytest: none of the dev extra's book, hub and browser tools, which
  # this stage's tests do not use. Bytecode is compiled here: without it (--no-compile) the chapters' kernels and
  # workers compiled torch's modules again and again, and this stage's chapters took twice the CPU (977 s vs 500 s)
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e . \
    "pytest>=8.0" "pytest-timeout>=2.3" "pytest-xdist>=3.5" 2>&1 | grep -v "is ignored" || true
  "$venv/bin/python" -c "import torch" || { echo "compat: install failed"; exit 1; }
  touch "$venv/.installed"
  echo "compat: installed in $(( $(date +%s) - start )) s"
fi
if $install_only; then exit 0; fi
"$venv/bin/python" - <<'PY'
import platform, torch
from dsgd_teach.memory import MiB, torch_build, worker_baseline
print(f"compat: Python {platform.python_version()}, torch {torch.__version__} ({torch_build()} build), "
      f"a worker's baseline after its imports: {worker_baseline() / MiB:.0f} MiB")
PY
# Every chapter in smoke mode on a deployment the course did not start (dask's CLI scheduler and workers, this
# Python's): the main suite runs each chapter in JupyterLab on its own local cluster and in full mode under the
# memory sampler, and leaves this third run to this stage (DSGD_DEPLOYMENT_CHAPTERS=compat there). Then the oracles
# (parallel = sequential, the hand-written collectives = torch.distributed) and worker memory. The fault tests
# (killed and paused workers) run in the main suite only: they exercise dask's recovery, which is the same dask here.
# Chapter 05's emulated hosts (network namespaces, root only) are made by the main suite's run of the chapter.
export DSGD_SHAPED_HOSTS=0
export DSGD_DEPLOYMENT_CHAPTERS=here
exec "$venv/bin/python" -m pytest -p no:cacheprovider -q -n "${JOBS:-2}" --dist load \
  tests/test_external_deployment.py \
  tests/test_worker_memory.py \
  tests/test_sgd.py \
  tests/test_collectives_oracle.py \
  "$@"
