"""Print the course's JupyterLab workspace for a server whose root is not course/ (Binder's is the repository).

binder/dsgd.jupyterlab-workspace names its notebook relative to course/, the root `make lab` serves. This script
prints the same layout with every notebook under `--prefix` and the workspace id `--name`; binder/start pipes it
into `jupyter lab workspaces import -` with the id `default`, the workspace that /lab opens.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

WORKSPACE = Path(__file__).with_name("dsgd.jupyterlab-workspace")


def rebase(value: object, prefix: str) -> object:
    """The workspace (or a part of it) with every `notebook:<path>` name and notebook path moved under prefix."""
    if isinstance(value, str):
        return f"notebook:{prefix}{value[len('notebook:'):]}" if value.startswith("notebook:") else value
    if isinstance(value, list):
        return [rebase(v, prefix) for v in value]
    if isinstance(value, dict):
        out = {rebase(k, prefix): rebase(v, prefix) for k, v in value.items()}
        if out.get("factory") == "Notebook" and isinstance(out.get("path"), str):
            out["path"] = prefix + out["path"]
        return out
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prefix", default="course/", help="folder of the notebooks, seen from the server's root")
    parser.add_argument("--name", default="default", help="workspace id (default: the one /lab opens)")
    args = parser.parse_args(argv)
    workspace = json.loads(WORKSPACE.read_text())
    workspace = {"data": rebase(workspace["data"], args.prefix), "metadata": {"id": args.name}}
    json.dump(workspace, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
