"""Grade a class on a dask cluster: each run in its own sandbox on some worker's host, every verdict on the driver.

`ClusterRun(address)` stands in for `batch.run_worker`: `grade_batch(..., run=ClusterRun(...))` reads and bounds
every notebook and rebuilds it with the source's tests in the driver, as for a local batch, then hands the cells to
this object from one of its threads per submission in flight; it submits one task (`run_on_worker`) to the cluster
and waits for it. On the worker the task runs `batch.run_worker`, the same bubblewrap (or container-mode) sandbox
as a local batch, with the limits of that host (one socket share per worker thread), and returns the result already
bounded and checked against the report schema (`reports.py`). The verdict, the feedback, grades.csv and
grading.json are then made and written (atomically) by the driver, one row set per submission, exactly as locally:
the same seed gives the same grades.

A worker lost mid-task (its host or process gone) is noticed by the scheduler, which runs the task again on another
worker (dask's `distributed.scheduler.allowed-failures`, 3 by default); a task that raises is retried (`retries`).
Only the driver counts a result, once per submission: a run on a lost worker never reaches it, and a submission
whose task lost its worker more often than dask allows scores zero with the reason, unflagged, like a local worker
that died. Every wait has a timeout. grading/ imports nothing of the course: this module uses `distributed` only.
"""

from __future__ import annotations

import dataclasses
import secrets
import threading
from collections import Counter
from typing import Any

from . import bubblewrap, cgroups
from .batch import Limits, note_unenforced, run_worker, unenforced
from .text import clean

CONNECT_S = 30
RETRIES = 2  # a task that raises (not one whose worker died: the scheduler reschedules those) runs again
_checked: set[str] = set()  # on a worker: the sandbox kinds found to work in this process
_checked_lock = threading.Lock()


def check_worker(sandbox: bool | str = True) -> str:
    """On a worker: '' when this host can build the sandbox (checked once per process), else why not."""
    key = str(sandbox)
    with _checked_lock:
        if key in _checked or not sandbox:
            return ""
        try:
            if sandbox is True:
                bubblewrap.require()
                cgroups.sweep()
        except RuntimeError as exc:
            return clean(exc, 400)
        _checked.add(key)
        return ""


def run_on_worker(cells: list[dict[str, Any]], mode: str, limits: Limits, seed: int, protected: list[str],
                  sandbox: bool | str) -> dict[str, Any]:
    """On a worker: run_worker's result, the cgroup limits this process could not enforce, and who ran it."""
    from distributed import get_worker

    worker = get_worker()
    why = check_worker(sandbox)
    if why:
        raise RuntimeError(f"worker {worker.address} cannot build the grading sandbox: {why}")
    local = dataclasses.replace(limits, jobs=max(1, int(getattr(worker, "nthreads", 1) or 1)))
    result = run_worker(cells, mode, local, seed, protected, sandbox=sandbox)
    return {"result": result, "unenforced": unenforced(), "worker": worker.address}


class ClusterRun:
    """`run_worker` on a dask cluster: one task per run, its result counted once, on the driver."""

    def __init__(self, address: str, *, sandbox: bool | str = True, connect_s: float = CONNECT_S) -> None:
        from distributed import Client

        self.address = address
        self.client = Client(address, timeout=connect_s, set_as_default=False)
        self.ran_on: dict[str, str] = {}  # task key -> the worker whose result was counted
        self._lock = threading.Lock()
        try:
            self.slots = self._check(sandbox)
        except BaseException:
            self.client.close()
            raise

    def _check(self, sandbox: bool | str) -> int:
        """The cluster's worker threads; RuntimeError when there are none or a worker cannot build the sandbox."""
        workers = self.client.scheduler_info(n_workers=-1)["workers"]
        if not workers:
            raise RuntimeError(f"the dask cluster at {self.address} has no workers")
        answers = self.client.run(check_worker, sandbox)
        bad = [f"{addr}: {why}" for addr, why in sorted(answers.items()) if why]
        if bad:
            raise RuntimeError("some workers cannot build the grading sandbox: " + "; ".join(bad)[:1000])
        return sum(int(w.get("nthreads", 1)) for w in workers.values())

    def __call__(self, cells: list[dict[str, Any]], mode: str, limits: Limits, seed: int, protected: list[str],
                 *, sandbox: bool | str = True) -> dict[str, Any]:
        """Run one notebook's cells on some worker; errors (a lost task, a timeout) become {"error"}, unflagged."""
        from distributed import KilledWorker

        key = f"dsgd-grade-{mode}-{secrets.token_hex(8)}"
        wait_s = (limits.notebook_s + limits.kill_grace_s) * (RETRIES + 4) + 120  # queued, rerun, retried
        future = self.client.submit(run_on_worker, cells, mode, limits, seed, protected, sandbox, key=key,
                                    pure=False, retries=RETRIES)
        try:
            out = future.result(timeout=wait_s)
        except KilledWorker as exc:
            return {"error": f"the cluster lost every worker that ran this notebook ({clean(exc, 200)})"}
        except TimeoutError:
            return {"error": f"the cluster returned no result within {wait_s} s"}
        except Exception as exc:  # noqa: BLE001 - a task that failed RETRIES + 1 times is this run's failure
            return {"error": f"grading on the cluster failed: {type(exc).__name__}: {clean(exc, 300)}"}
        finally:
            future.release()
        with self._lock:
            self.ran_on[key] = out["worker"]
        for why in out.get("unenforced", []):
            note_unenforced(str(why))
        return out["result"]

    def graded_by(self) -> Counter[str]:
        """How many runs each worker's result was counted for."""
        with self._lock:
            return Counter(self.ran_on.values())

    def close(self) -> None:
        """Disconnect from the scheduler (the cluster keeps running)."""
        self.client.close()

    def __enter__(self) -> ClusterRun:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
