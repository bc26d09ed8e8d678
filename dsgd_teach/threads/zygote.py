"""A short-lived process that imports torch once, then forks one fresh child per configuration and process.

Why: torch's inter-op pool can be sized only once per process, before any inter-op work, so every
configuration needs a new process; starting Python and importing torch costs seconds, forking costs
milliseconds. This process never runs torch work itself, so each child starts with unstarted thread pools
(the same reason DataLoader workers may be forked). Protocol: a JSON job on stdin; one JSON line per
configuration on stdout. The P children of a configuration wait at a barrier after building and warming up
their work, so they compute at the same time (that is what oversubscription needs).

Started by fresh.py on a dask worker (see fresh.zygote_command); `python -m dsgd_teach.threads.zygote` works too.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import time
import traceback
from typing import Any

import torch

from .lines import LineReader
from .streams import stream_benches
from .towers import tower_benches
from .workloads import Bench, median_time, op_benches


def die_with_parent() -> None:
    """Ask Linux to kill this process when its parent dies (a killed worker or zygote leaves no orphans)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # best effort: the timeouts still bound every wait
        pass


def apply_threads(intra: int, inter: int) -> None:
    """Size both pools; must come before any parallel work in this process (inter-op can be set once only)."""
    torch.set_num_interop_threads(inter)
    torch.set_num_threads(intra)


def settings_in_effect() -> dict[str, Any]:
    """What this process really runs with: torch's two pool sizes and its process ids."""
    return {
        "num_threads": torch.get_num_threads(),
        "num_interop_threads": torch.get_num_interop_threads(),
        "pid": os.getpid(),
        "zygote_pid": os.getppid(),
    }


def prepare(suite: dict[str, Any]) -> list[Bench]:
    """Build and warm up every bench the suite asks for."""
    seed, warmup = int(suite["seed"]), int(suite["warmup"])
    benches = op_benches(list(suite.get("ops", [])), int(suite["size"]), seed, warmup)
    if suite.get("towers"):
        t = suite["towers"]
        benches += tower_benches(int(t["width"]), int(t["depth"]), int(t["batch"]), seed, warmup)
    if suite.get("streams"):
        s = suite["streams"]
        benches += stream_benches(int(s["size"]), int(s["chains"]), int(s["depth"]), seed, warmup)
    return benches


def measure(benches: list[Bench], repeats: int) -> list[dict[str, Any]]:
    """Time every bench (median of `repeats`) and report it with the thread settings in effect right then."""
    rows = []
    for b in benches:
        row: dict[str, Any] = {"workload": b.workload, "variant": b.variant, "flops": b.flops, **b.extra}
        if b.fn is not None:
            row["seconds"], row["seconds_min"] = median_time(b.fn, repeats)
            row["repeats"] = repeats
        row.update(settings_in_effect())
        rows.append(row)
    return rows


def _child(cfg: dict[str, Any], go_fd: int, out_fd: int) -> None:
    """Body of one forked child: set threads, prepare, report ready, wait for go, measure, report, exit."""
    code = 0
    try:
        die_with_parent()
        apply_threads(int(cfg["intra"]), int(cfg["inter"]))
        benches = prepare(cfg["suite"])
        os.write(out_fd, b"ready\n")
        if os.read(go_fd, 1) != b"g":
            os._exit(3)  # the parent gave up on this configuration
        payload: dict[str, Any] = {"rows": measure(benches, int(cfg["suite"]["repeats"]))}
    except BaseException as exc:  # reported to the driver as a clear error
        payload, code = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}, 1
    try:
        os.write(out_fd, (json.dumps(payload) + "\n").encode())
    finally:
        os._exit(code)


def _line(reader: LineReader, deadline: float) -> str | None:
    """The next line from a child, None when it closed its pipe; TimeoutError past the deadline."""
    while True:
        line = reader.read_line(max(0.0, deadline - time.monotonic()))
        if line is not None or reader.eof:
            return line
        if time.monotonic() >= deadline:
            raise TimeoutError("a child process did not answer in time")


def run_config(cfg: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """Fork cfg['processes'] children, release them together, gather their rows (or the first error)."""
    deadline = time.monotonic() + timeout_s
    kids: list[tuple[int, int, LineReader]] = []
    try:
        for _ in range(int(cfg["processes"])):
            go_r, go_w = os.pipe()
            out_r, out_w = os.pipe()
            pid = os.fork()
            if pid == 0:  # child: keep only its own two pipe ends, so a dead parent means EOF here
                for fd in [go_w, out_r] + [f for _, w, r in kids for f in (w, r.fd)]:
                    os.close(fd)
                _child(cfg, go_r, out_w)
            os.close(go_r)
            os.close(out_w)
            kids.append((pid, go_w, LineReader(out_r)))
        errors = []
        for _, _, reader in kids:  # barrier: everyone built and warmed up its work
            first = _line(reader, deadline)
            if first != "ready":
                errors.append(json.loads(first)["error"] if first else "child exited without a word")
        for _, go_w, _ in kids:
            try:
                os.write(go_w, b"g" if not errors else b"x")
            except BrokenPipeError:  # that child has already exited; its own line says why (read above or below)
                pass
        if errors:
            return {"error": errors[0]}
        rows = []
        for proc, (_, _, reader) in enumerate(kids):
            reply = json.loads(_line(reader, deadline) or '{"error": "child died while measuring"}')
            if "error" in reply:
                return {"error": reply["error"], "traceback": reply.get("traceback", "")}
            for row in reply["rows"]:
                rows.append({**row, "proc": proc})
        return {"rows": rows}
    finally:
        for pid, go_w, reader in kids:
            for fd in (go_w, reader.fd):
                try:
                    os.close(fd)
                except OSError:
                    pass
            _reap(pid, deadline)


def _reap(pid: int, deadline: float) -> None:
    """Wait for a child until the deadline, then kill it: no child outlives its configuration."""
    while time.monotonic() < deadline:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            return
        time.sleep(0.01)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    os.waitpid(pid, 0)


def main() -> None:
    """Read the job, run its configurations one after the other, print one JSON line each."""
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # stacks on demand (fresh.py's timeout message)
    die_with_parent()
    job = json.loads(sys.stdin.readline())
    info = {"worker_pid": os.getppid(), "zygote_pid": os.getpid(), "omp_env": os.environ.get("OMP_NUM_THREADS", "")}
    for index, cfg in enumerate(job["configs"]):
        try:
            reply = run_config(cfg, float(job["timeout_s"]))
        except Exception as exc:
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps({"config": index, **info, **reply}), flush=True)


if __name__ == "__main__":
    main()
