"""A dask deployment started with dask's own command line (`dask scheduler`, `dask worker`), and its fingerprint.

Tests and the lecturer's emulated hosts use it to run the course the way a department would: against workers
the course did not start. `fingerprint` is what "left exactly as it was" means: the same workers, and no tasks,
actors, worker plugins, published datasets or stored results left on the scheduler or the workers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from distributed import Client

from ...memory import plan_worker_memory

#: dask's own command line, from this interpreter's environment (`dask scheduler`, `dask worker`).
DASK_CLI = str(Path(sys.executable).with_name("dask"))
DASK = [DASK_CLI, "scheduler"]
DASK_WORKER = [DASK_CLI, "worker"]


@dataclass
class Deployment:
    """Scheduler and worker processes started with dask's CLI; stop() ends them (by process group)."""

    scheduler_file: Path
    procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def address(self) -> str:
        """The scheduler's address, read from its scheduler file."""
        return json.loads(self.scheduler_file.read_text())["address"]

    def stop(self, timeout: float = 20.0) -> None:
        """Terminate every process started (workers first), killing what does not exit in time."""
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + timeout
        for proc in reversed(self.procs):
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def _wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not ready within {timeout:.0f} s")
        time.sleep(0.2)


def start_scheduler(workdir: Path, host: str = "127.0.0.1", prefix: list[str] | None = None,
                    log: Path | None = None, timeout: float = 60.0) -> Deployment:
    """`dask scheduler --host HOST --port 0` (a free port), waited for through its scheduler file."""
    sfile = workdir / "scheduler.json"
    cmd = [*(prefix or []), *DASK, "--host", host, "--port", "0", "--dashboard-address", f"{host}:0",
           "--scheduler-file", str(sfile)]
    out = open(log or os.devnull, "ab")  # noqa: SIM115 - handed to the child, closed with the test's tmp dir
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    dep = Deployment(sfile, [proc])
    try:
        _wait_for(lambda: sfile.exists() and sfile.stat().st_size > 0 or proc.poll() is not None, timeout,
                  "dask scheduler")
        if proc.poll() is not None:
            raise RuntimeError(f"dask scheduler exited with {proc.returncode}: {' '.join(cmd)}")
    except BaseException:
        dep.stop()
        raise
    return dep


def start_worker(dep: Deployment, host: str = "127.0.0.1", prefix: list[str] | None = None,
                 log: Path | None = None, env: dict[str, str] | None = None) -> subprocess.Popen:
    """`dask worker --nthreads 1 --host HOST` connected to dep's scheduler (not waited for), with the memory limit
    the course would give one of two workers here (a fixed 1 GiB paused workers of PyPI's CUDA torch build)."""
    cmd = [*(prefix or []), *DASK_WORKER, dep.address, "--nthreads", "1", "--host", host,
           "--dashboard-address", f"{host}:0", "--memory-limit", str(plan_worker_memory(2).limit)]
    out = open(log or os.devnull, "ab")  # noqa: SIM115
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    dep.procs.append(proc)
    return proc


def wait_for_workers(address: str, n: int, timeout: float = 120.0) -> None:
    """Block until n workers are connected to the scheduler at address."""
    with Client(address, timeout="20s") as client:
        client.wait_for_workers(n, timeout=timeout)


def _worker_state(dask_worker: Any) -> dict[str, Any]:
    return {"actors": len(dask_worker.state.actors), "data": len(dask_worker.data),
            "tasks": len(dask_worker.state.tasks), "plugins": sorted(dask_worker.plugins)}


def _scheduler_state(dask_scheduler: Any) -> dict[str, Any]:
    return {"tasks": len(dask_scheduler.tasks), "datasets": sorted(dask_scheduler.extensions["publish"].datasets),
            "worker_plugins": sorted(dask_scheduler.worker_plugins),
            "variables": sorted(dask_scheduler.extensions["variables"].variables)}


def fingerprint(address: str) -> dict[str, Any]:
    """Workers (address -> id) plus everything a run could leave on the scheduler or the workers."""
    with Client(address, timeout="20s") as client:
        try:
            info = client.sync(client.scheduler.identity, n_workers=-1)
        except TypeError:  # distributed versions whose identity() takes no n_workers
            info = client.sync(client.scheduler.identity)
        return {
            "workers": {a: w["id"] for a, w in sorted(info["workers"].items())},
            "scheduler": client.run_on_scheduler(_scheduler_state),
            "on_workers": client.run(_worker_state),
        }


def main(argv: list[str] | None = None) -> int:
    """`python -m dsgd_teach.runtime.clusters.deployment wait ADDRESS N` or `fingerprint ADDRESS` (prints JSON), e.g. on a host."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["wait"] and len(args) == 3:
        wait_for_workers(args[1], int(args[2]))
        return 0
    if args[:1] == ["fingerprint"] and len(args) == 2:
        print(json.dumps(fingerprint(args[1]), sort_keys=True))
        return 0
    print("usage: python -m dsgd_teach.runtime.clusters.deployment wait ADDRESS N | fingerprint ADDRESS", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
