"""A student's Jupyter server on the course's hub: the course in their home, its workspace, then the server.

JupyterHub runs this (c.Spawner.cmd in jupyterhub_config.py) as the student, in their home, with the hub's
arguments; it then runs `python -m jupyterhub.singleuser` with those arguments. Before that it:

1. copies the course's chapters, NOTATION.md and solutions/ into ~/course, the first time only (a student's
   edits are never overwritten; assignments come through nbgrader, not this copy);
2. imports the course's JupyterLab workspace (binder/dsgd.jupyterlab-workspace with its notebooks under course/)
   as the workspace /lab opens, at every start, as `make lab` and Binder do: chapter 00 beside the Task Stream,
   Progress and Workers panes, with the Dask side panel open. Once a notebook started its cluster, the side
   panel's search button finds that cluster's dashboard (dask-labextension asks the kernel for its client's
   dashboard_link: on the gateway /services/dask-gateway/clusters/<name>/status, served through the hub) and the
   panes show it;
3. points dask's dashboard link of a cluster started in the server itself (DSGD_GATEWAY=off) through
   jupyter-server-proxy under the server's prefix, the only way a browser reaches it behind the hub;
4. makes the hub's SIGINT (how it stops a server) the server's orderly stop (SIGTERM's): the server shuts every
   kernel down, and each kernel's client shuts its cluster down. Without a terminal, Jupyter's server leaves
   SIGINT to Python, whose KeyboardInterrupt ends it at once; its kernels then see their parent gone and exit
   without their atexit hooks, and a cluster they held stayed on the gateway until its idle time-out.

A workspace that cannot be imported is reported and the server starts with JupyterLab's plain layout.
"""

from __future__ import annotations

import json
import os
import runpy
import shutil
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: The course's notebooks (override with DSGD_HUB_COURSE) and the workspace that lays them out.
COURSE = Path(os.environ.get("DSGD_HUB_COURSE") or ROOT / "course")
WORKSPACE = ROOT / "binder" / "dsgd.jupyterlab-workspace"
#: Where the course lands in the student's home: the workspace's notebooks are below it.
TARGET = "course"


def copy_course(home: Path) -> Path:
    """The course's chapters in home/course (copied unless that folder exists)."""
    target = home / TARGET
    if target.exists():
        return target
    target.mkdir(parents=True)
    for item in sorted(COURSE.iterdir()):
        if item.is_file() and item.suffix in (".ipynb", ".md"):
            shutil.copy2(item, target / item.name)
    if (COURSE / "solutions").is_dir():
        shutil.copytree(COURSE / "solutions", target / "solutions")
    return target


def course_workspace() -> dict:
    """The course's workspace with its notebooks under course/, as the workspace `default` (the one /lab opens)."""
    sys.path.insert(0, str(WORKSPACE.parent))
    try:
        from lab_workspace import rebase
    finally:
        sys.path.remove(str(WORKSPACE.parent))
    data = json.loads(WORKSPACE.read_text())["data"]
    return {"data": rebase(data, f"{TARGET}/"), "metadata": {"id": "default"}}


def import_workspace(workspace: dict) -> None:
    """Import the workspace into the student's JupyterLab (~/.jupyter/lab/workspaces unless configured)."""
    done = subprocess.run([sys.executable, "-m", "jupyter", "lab", "workspaces", "import", "-"],
                          input=json.dumps(workspace), capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip()[-2000:])


def main(argv: list[str]) -> None:
    home = Path(os.environ.get("HOME") or Path.cwd())
    try:
        copy_course(home)
        import_workspace(course_workspace())
    except Exception as exc:  # the server still starts: the student sees the plain layout, the hub's log says why
        print(f"start_server: the course's workspace could not be set up ({exc}); /lab opens the plain layout",
              file=sys.stderr, flush=True)
    prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/")
    os.environ.setdefault("DASK_DISTRIBUTED__DASHBOARD__LINK", f"{prefix}proxy/{{port}}/status")
    signal.signal(signal.SIGINT, lambda *_: os.kill(os.getpid(), signal.SIGTERM))
    sys.argv = [sys.argv[0], *argv]
    runpy.run_module("jupyterhub.singleuser", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
