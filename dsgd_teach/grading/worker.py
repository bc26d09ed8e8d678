"""Grade one notebook in this process: run its cells in a fresh, fenced kernel and collect what each test reported.

Run as `python -m dsgd_teach.grading.worker [RESULT_FD]` with a JSON job on stdin; the JSON result is written to
RESULT_FD (a pipe only this process holds; inside the OS sandbox, see bubblewrap.py), else as the last line of
stdout. The kernel gets an empty temporary working directory, /dev/null as stdout and stderr, a pipe for the audit
hook's denials (read whole, see Denials), and only its check() reports (display data of one MIME type) are kept from what it sends: printed output, cleared or
updated displays and widget messages are dropped, so a flood or a clear_output cannot erase or swamp a report. A cell that times out or kills the kernel is skipped: the
kernel is restarted, the cells before it are replayed (already graded test cells are not re-run), and grading goes on
until the notebook's one wall-clock budget (job["budget_s"]) runs out.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __name__ == "__main__":  # this worker's own process, one per graded notebook: before nbformat is imported
    from .lean import skip_slow_optional_imports

    skip_slow_optional_imports()

import nbformat  # noqa: E402
from jupyter_client.kernelspec import KernelSpecManager  # noqa: E402
from jupyter_client.manager import AsyncKernelManager  # noqa: E402
from nbclient import NotebookClient  # noqa: E402
from nbclient.exceptions import CellExecutionComplete, CellTimeoutError, DeadKernelError  # noqa: E402

from .denials import Denials  # noqa: E402
from .kernel import warm_for  # noqa: E402
from .mime import MIME  # noqa: E402 - not probe's: that imports numpy, which the worker never needs

KERNEL_NAME = "dsgd-grading"
PREAMBLE = "from dsgd_teach.grading.probe import record as _dsgd_record, reference as _dsgd_reference\n"
MAX_RESTARTS = 4
MAX_RECORDS_PER_CELL = 10_000
CHANNEL_CLOSED = "the kernel closed its denial channel"
SANDBOX_NPROC = 96  # processes and threads of the whole sandbox (worker, kernel and what it starts)
SANDBOX_NOFILE = 1024


class BudgetSpent(Exception):
    """The notebook's wall-clock budget ran out."""


class _Client(NotebookClient):
    """NotebookClient that keeps each cell's execute_reply, whatever the cell printed."""

    replies: dict[int, dict[str, Any]]

    async def _check_raise_for_error(self, cell: Any, cell_index: int, exec_reply: dict[str, Any] | None) -> None:
        self.replies[cell_index] = (exec_reply or {}).get("content", {})

    def process_message(self, msg: dict[str, Any], cell: Any, cell_index: int) -> Any:
        """Keep only check() reports, append-only; everything else the kernel sends is dropped."""
        content = msg.get("content") or {}
        if msg.get("msg_type") == "status":
            if content.get("execution_state") == "idle":
                raise CellExecutionComplete()
            return None
        data = content.get("data")
        if msg.get("msg_type") == "display_data" and isinstance(data, dict) and MIME in data \
                and len(cell.outputs) < MAX_RECORDS_PER_CELL:
            out = nbformat.v4.new_output("display_data", data={MIME: data[MIME]})
            cell.outputs.append(out)
            return out
        return None


def _kernelspec(private: Path, job: dict[str, Any], workdir: Path, denial_fd: int) -> KernelSpecManager:
    spec_dir = private / "kernels" / KERNEL_NAME
    spec_dir.mkdir(parents=True)
    argv = [sys.executable, "-m", "dsgd_teach.grading.kernel", str(job["memory_mb"]), str(job["cpu_s"]),
            str(workdir), json.dumps(job.get("protected", [])), str(denial_fd), "--", "-f", "{connection_file}",
            "--HistoryManager.enabled=False"]
    (spec_dir / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "grading", "language": "python"}))
    return KernelSpecManager(kernel_dirs=[str(private / "kernels")])


def _kernel_env(workdir: Path, seed: int, warm: str = "") -> dict[str, str]:
    keep = ("PATH", "LANG", "LC_ALL", "PYTHONHASHSEED", "PYTHONPATH")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env.update(HOME=str(workdir), TMPDIR=str(workdir), IPYTHONDIR=str(workdir / ".ipython"),
               MPLCONFIGDIR=str(workdir / ".mpl"), JUPYTER_PLATFORM_DIRS="1", DSGD_GRADER_SEED=str(seed),
               OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1", MPLBACKEND="Agg",
               PYTHONDONTWRITEBYTECODE="1", DSGD_SMOKE="1", DSGD_KERNEL_WARM=warm)
    return env


def _test_result(cell: Any, reply: dict[str, Any] | None) -> dict[str, Any]:
    records = [o["data"][MIME] for o in cell.get("outputs", []) if o.get("output_type") == "display_data"
               and isinstance(o.get("data"), dict) and MIME in o["data"]]
    reply = reply or {}
    status = reply.get("status", "no reply")
    return {"status": "ok" if status == "ok" else "error", "records": records,
            "error": f"{reply.get('ename', '')}: {reply.get('evalue', '')}"[:500] if status != "ok" else ""}


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    """Execute job["cells"] in a fenced kernel; {"tests": {grade_id: result}, "skipped": [...], "flags": [...]}."""
    cells = job["cells"]
    deadline = time.monotonic() + job.get("budget_s", 10**9)
    stopped = ""
    tests: dict[str, dict[str, Any]] = {}
    skipped: list[dict[str, Any]] = []
    private = Path(tempfile.mkdtemp(prefix="dsgd-grader-"))
    flags: list[str] = []
    errors: dict[int, str] = {}
    start_failures = 0
    try:
        for attempt in range(MAX_RESTARTS + 1):
            workdir = Path(tempfile.mkdtemp(prefix="dsgd-kernel-"))
            try:
                failed = _attempt(job, cells, tests, {s["index"] for s in skipped}, private, workdir, attempt,
                                  flags, errors, deadline)
            except BudgetSpent as spent:
                stopped = f"the notebook's time budget of {job['budget_s']} s ran out {spent}"
                for cell in cells:
                    if cell.get("grade_id") and cell["grade_id"] not in tests:
                        tests[cell["grade_id"]] = {"status": "not run", "records": [], "error": stopped}
                break
            finally:
                shutil.rmtree(workdir, ignore_errors=True)
            if failed is None:
                break
            if failed["index"] < 0:
                start_failures += 1
                if start_failures < 2:
                    continue  # a slow machine can miss the start-up deadline once; try a fresh kernel
                for cell in cells:
                    if cell.get("grade_id") and cell["grade_id"] not in tests:
                        tests[cell["grade_id"]] = {"status": "not run", "records": [],
                                                   "error": f"the grading kernel failed to start: {failed['detail']}"}
                break
            skipped.append(failed)
            gid = cells[failed["index"]].get("grade_id")
            if gid:
                tests[gid] = {"status": failed["why"], "records": [], "error": failed["detail"]}
        else:
            for cell in cells:
                if cell.get("grade_id") and cell["grade_id"] not in tests:
                    tests[cell["grade_id"]] = {"status": "not run", "records": [],
                                               "error": f"the kernel died or timed out {MAX_RESTARTS + 1} times"}
    finally:
        shutil.rmtree(private, ignore_errors=True)
    return {"tests": tests, "skipped": skipped, "flags": list(dict.fromkeys(flags))[:50],
            "cell_errors": [{"index": i, "error": e} for i, e in sorted(errors.items())], "stopped": stopped}


def _attempt(job: dict[str, Any], cells: list[dict[str, Any]], tests: dict[str, Any], skip: set[int],
             private: Path, workdir: Path, attempt: int, flags: list[str],
             errors: dict[int, str], deadline: float) -> dict[str, Any] | None:
    """One kernel's run over the cells; returns the cell that killed it or timed out, else None.

    Raises BudgetSpent when the notebook's deadline passes; each cell's timeout is cut to the time left.
    """
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(PREAMBLE)] + [nbformat.v4.new_code_cell(c["source"]) for c in cells]
    denials = Denials()
    ksm = _kernelspec(private / f"spec{attempt}", job, workdir, denials.write_fd)
    km = AsyncKernelManager(kernel_name=KERNEL_NAME, kernel_spec_manager=ksm)
    km.connection_file = str(workdir / ".kernel.json")
    client = _Client(nb, km=km, timeout=job["timeout"], allow_errors=True,
                     startup_timeout=max(1, min(120, int(deadline - time.monotonic()))),
                     shutdown_kernel="immediate", record_timing=False)
    client.replies = {}
    current = -1

    def run(index: int) -> None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise BudgetSpent(f"before cell {index}" if index > 0 else "before the kernel started")
        client.timeout = max(1, min(job["timeout"], int(left) + 1))
        client.execute_cell(nb.cells[index], index)
        if denials.eof.is_set() and CHANNEL_CLOSED not in flags:
            flags.append(CHANNEL_CLOSED)

    warm = warm_for(c["source"] for c in job["cells"])  # torch and the like, imported before the fence
    try:
        with client.setup_kernel(cwd=str(workdir), env=_kernel_env(workdir, job["seed"], warm),
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, pass_fds=(denials.write_fd,), cleanup_kc=True):
            denials.close_writer()
            run(0)
            denials.mark()  # the kernel's start-up is over: what it is denied from now on is the student's doing
            for i, spec in enumerate(cells):
                gid = spec.get("grade_id")
                if i in skip or (gid and gid in tests):
                    continue
                current = i
                run(i + 1)
                reply = client.replies.get(i + 1) or {}
                if gid:
                    tests[gid] = _test_result(nb.cells[i + 1], reply)
                elif reply.get("status") != "ok":
                    errors[i] = f"{reply.get('ename', '?')}: {reply.get('evalue', '')}"[:300]
            current = len(cells)  # every cell ran; a failure from here on is the kernel's shutdown
        return None
    except (CellTimeoutError, DeadKernelError, RuntimeError) as exc:
        if current < len(cells) and time.monotonic() >= deadline:
            raise BudgetSpent(f"during cell {current + 1}") from None
        return None if current == len(cells) else _failure(exc, current, job)
    finally:
        denials.close_writer()
        flags.extend(denials.flags())


def _failure(exc: Exception, index: int, job: dict[str, Any]) -> dict[str, Any]:
    """Describe the cell that timed out or took the kernel down (index -1: the kernel never started)."""
    if isinstance(exc, CellTimeoutError):
        return {"index": index, "why": "timeout", "detail": f"cell ran longer than {job['timeout']} s"}
    if isinstance(exc, DeadKernelError):
        return {"index": index, "why": "kernel died", "detail": _death_reason(job)}
    return {"index": index, "why": "kernel died", "detail": f"{type(exc).__name__}: {exc}"[:300]}


def _death_reason(job: dict[str, Any]) -> str:
    return (f"the kernel died (os._exit, a killed kernel, {job['cpu_s']} s of CPU time, "
            f"or {job['memory_mb']} MB of memory exceeded)")


def main(argv: list[str]) -> None:
    """Read a job from stdin, run it, write the result as JSON to the result fd (argv[0]) or stdout."""
    result_fd = int(argv[0]) if argv else None
    if result_fd is not None:
        os.set_inheritable(result_fd, False)  # the kernel must never hold the result channel
        for res, value in ((resource.RLIMIT_NPROC, SANDBOX_NPROC), (resource.RLIMIT_NOFILE, SANDBOX_NOFILE)):
            resource.setrlimit(res, (value, value))
    _undumpable()  # first: the kernel (same uid) must not reach this process's fds or memory through /proc
    job = json.loads(sys.stdin.read())
    limit = (job["memory_mb"] + 2048) * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    result = (json.dumps(run_job(job)) + "\n").encode()
    if result_fd is None:
        sys.stdout.write("\n" + result.decode())
        sys.stdout.flush()
        return
    view = memoryview(result)
    while view:
        view = view[os.write(result_fd, view):]
    os.close(result_fd)


def _undumpable() -> None:
    """Hide this process's /proc entries (cwd, environ, memory) from other processes of the same user (Linux)."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except (OSError, AttributeError):
        pass


if __name__ == "__main__":
    main(sys.argv[1:])
