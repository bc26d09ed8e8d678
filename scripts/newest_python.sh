#!/usr/bin/env bash
# Print the newest supported CPython (3.13 down to 3.10) on this machine that runs and can make a venv, other than
# version $1 (the main environment's, e.g. 3.11); print nothing and exit 1 where there is none. Looks on PATH and in
# pyenv's versions, whose shims on PATH fail for versions that are not active.
set -uo pipefail
exclude=${1:-}
root=$(pyenv root 2>/dev/null || echo "${PYENV_ROOT:-$HOME/.pyenv}")
for v in 3.13 3.12 3.11 3.10; do
  [ "$v" = "$exclude" ] && continue
  for candidate in "$(command -v "python$v" 2>/dev/null)" "$root"/versions/"$v".*/bin/python"$v"; do
    [ -n "$candidate" ] && [ -x "$candidate" ] || continue
    if "$candidate" -c "import sys, venv, ensurepip; assert sys.version_info[:2] == tuple(map(int, '$v'.split('.')))" \
        >/dev/null 2>&1; then
      echo "$candidate"
      exit 0
    fi
  done
done
exit 1
