"""Run thread-pool configurations in fresh processes started by a cluster worker, streaming rows back.

A dask worker already runs torch with its pools sized (and the inter-op size is fixed for its lifetime), so the
worker itself never measures: it starts a zygote process (zygote.py), which forks one fresh child per
configuration. Every measurement row says which pools were really in effect and in which process. The
zygote runs in its own process group, which is killed on stop, timeout or error: nothing is left behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from distributed import Client

from ..runtime.clusters.cluster import cpu_count, worker_addresses
from ..runtime.ranks.live import WorkerContext, run_live
from ..trace import TraceRecorder
from .lines import LineReader

#: Starts the zygote without running the package __init__ files (dask, pandas, matplotlib): the fresh process
#: then imports only torch and the four small modules it needs, which saves seconds per run on a small machine.
#: Its first line makes SIGUSR1 print every thread's Python stack to stderr (in forked children too), so a
#: configuration that hangs can say where.
_BOOT = (
    "import faulthandler, signal; faulthandler.register(signal.SIGUSR1, all_threads=True)\n"
    "import sys, types\n"
    "for name, path in (('dsgd_teach', {root!r}), ('dsgd_teach.threads', {here!r})):\n"
    "    pkg = types.ModuleType(name); pkg.__path__ = [path]; sys.modules[name] = pkg\n"
    "from dsgd_teach.threads.zygote import main\n"
    "main()\n"
)


def zygote_command() -> list[str]:
    """The command line that starts a zygote process (light import path, see _BOOT)."""
    here = os.path.dirname(os.path.abspath(__file__))
    return [sys.executable, "-c", _BOOT.format(root=os.path.dirname(here), here=here)]


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill the zygote and every child it forked (they share its process group)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=10)


def _stacks(proc: subprocess.Popen, errors: Any) -> str:
    """Ask the zygote and its children for their Python stacks (SIGUSR1) and return what they wrote."""
    try:
        os.killpg(proc.pid, signal.SIGUSR1)
    except ProcessLookupError:
        return ""
    size, deadline = -1, time.monotonic() + 2.0
    while time.monotonic() < deadline:  # until the dumps stop growing
        time.sleep(0.2)
        now = os.fstat(errors.fileno()).st_size
        if now == size:
            break
        size = now
    errors.seek(0)
    tail = errors.read().decode(errors="replace")[-4000:]
    return f"; where the measuring processes were:\n{tail}" if tail.strip() else ""


def zygote_task(ctx: WorkerContext, job: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """Worker side: start the zygote, forward each configuration's rows as trace events, stop when asked."""
    n_configs, cores = len(job["configs"]), cpu_count()
    deadline = time.monotonic() + timeout_s
    with tempfile.TemporaryFile() as errors:
        proc = subprocess.Popen(
            zygote_command(),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors, start_new_session=True,
        )
        try:
            proc.stdin.write((json.dumps(job) + "\n").encode())
            proc.stdin.close()
            reader, done, stopped = LineReader(proc.stdout.fileno()), 0, False
            while done < n_configs:
                if ctx.should_stop():
                    stopped = True
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"thread experiment not finished within {timeout_s:.0f} s ({done} of {n_configs} done)"
                        + _stacks(proc, errors)
                    )
                line = reader.read_line(0.2)
                if line is None:
                    if reader.eof:
                        errors.seek(0)
                        tail = errors.read().decode(errors="replace")[-1500:]
                        raise RuntimeError(f"the measuring process exited early (code {proc.wait(10)}): {tail}")
                    continue
                reply = json.loads(line)
                cfg = job["configs"][reply["config"]]
                if "error" in reply:
                    raise RuntimeError(
                        f"configuration {reply['config']} (intra_threads={cfg['intra']}, interop_threads={cfg['inter']}, "
                        f"processes={cfg['processes']}) failed in its fresh process: {reply['error']}"
                    )
                for row in reply["rows"]:
                    ctx.emit(
                        step=reply["config"], event="measure", intra_threads=cfg["intra"], interop_threads=cfg["inter"],
                        processes=cfg["processes"], worker_pid=reply["worker_pid"], omp_env=reply["omp_env"],
                        cores=cores, **row,
                    )
                done += 1
            return {"configs_done": done, "stopped": stopped, "worker_pid": os.getpid()}
        finally:
            _kill_group(proc)


def on_worker(client: Client, fn: Callable[[], Any], timeout_s: float = 60.0) -> Any:
    """Run a small query (e.g. the core count) on the first worker, where the experiments run."""
    addresses = worker_addresses(client)
    if not addresses:
        raise RuntimeError("the cluster has no workers")
    future = client.submit(fn, workers=[addresses[0]], allow_other_workers=False, pure=False)
    try:
        return future.result(timeout=timeout_s)
    finally:
        future.release()


def worker_cores(client: Client) -> int:
    """Cores the first worker may use: what 'the machine' means for these experiments."""
    return int(on_worker(client, cpu_count))


def _cuda_on_worker() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def worker_has_cuda(client: Client) -> bool:
    """Whether the first worker sees a CUDA device."""
    return bool(on_worker(client, _cuda_on_worker))


def run_fresh(
    client: Client, configs: list[dict[str, Any]], recorder: TraceRecorder, timeout_s: float
) -> tuple[dict[str, Any] | None, bool]:
    """Driver side: run the configurations on the first worker; rows reach recorder (and on_update) as they come."""
    job = {"configs": configs, "timeout_s": timeout_s}
    results, stopped = run_live(client, zygote_task, [(job, timeout_s)], recorder, timeout_s=timeout_s + 30)
    info = results[0] if results else None
    return info, stopped or bool(info and info.get("stopped"))
