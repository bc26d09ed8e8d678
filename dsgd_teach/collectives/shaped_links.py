"""Chapter 05 on shaped links: star (naive) against ring over emulated hosts, with the alpha-beta model's prediction.

Makes 1 + max(worlds) emulated hosts (dsgd_teach.runtime.clusters.hosts) whose links are token buckets of `rate`: the dask
scheduler and the measuring driver on host 0, one single-threaded `dask worker` on each other host. On host 0, for
each world size N, one process group of N ranks fits alpha and beta from a ping-pong and times both algorithms on a
vector of `mib` MiB. Everything made is removed on the way out. The chapter's cell calls `shaped_allreduce`; the
benchmark (dsgd_teach/bench/shaped_hosts.py) calls `measure_on_shaped_hosts` with more repeats and message sizes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

from ..runtime.clusters import hosts

ALGORITHMS = ("naive", "ring")
MODULE = "dsgd_teach.collectives.shaped_links"  # run as `python -m MODULE ADDRESS ...` on host 0


class MeasurementFailed(RuntimeError):
    """The measuring process on host 0 exited with an error (its stderr's tail is the message)."""


def shaped_unavailable() -> str | None:
    """Why chapter 05 cannot make shaped hosts here (None when it can): turned off with DSGD_SHAPED_HOSTS=0, no root
    or tools, or an outside deployment."""
    if os.environ.get("DSGD_SHAPED_HOSTS", "1").strip() == "0":
        return ("turned off (DSGD_SHAPED_HOSTS=0): the five extra processes, each importing torch, would not fit in "
                "the memory this kernel is given")
    reason = hosts.available()
    if reason:
        return reason
    if os.environ.get("DSGD_SCHEDULER"):
        return ("this kernel uses an existing dask deployment (DSGD_SCHEDULER), perhaps on emulated hosts already; "
                "the shaped-links demonstration makes hosts of its own only on a machine the course runs alone")
    return None


def measure_on_shaped_hosts(worlds: tuple[int, ...], rate: str, mib: float, repeats: int,
                            pingpong_sizes: tuple[int, ...], pingpong_repeats: int, run_timeout_s: float,
                            timeout_s: float) -> dict[str, Any]:
    """Make the shaped hosts, start dask on them with its CLI, measure from host 0 (`measure_inside`), remove all.

    Returns measure_inside's dict plus "tcp_retransmits" (all hosts). Raises MeasurementFailed when the measuring
    process fails, subprocess.TimeoutExpired after timeout_s.
    """
    with hosts.shaped_deployment(1 + max(worlds), rate) as (h, dep):
        args = [dep.address, "--worlds", *map(str, worlds), "--mib", str(mib), "--repeats", str(repeats),
                "--pingpong-sizes", *map(str, pingpong_sizes), "--pingpong-repeats", str(pingpong_repeats),
                "--run-timeout", str(run_timeout_s)]
        proc = h.run(0, sys.executable, "-m", MODULE, *args, capture_output=True, text=True, timeout=timeout_s)
        if proc.returncode != 0:
            raise MeasurementFailed(f"measuring on the shaped hosts failed:\n{proc.stderr[-3000:]}")
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        return {**out, "tcp_retransmits": hosts.retransmits(h)}


def measure_inside(address: str, worlds: tuple[int, ...], mib: float, repeats: int,
                   pingpong_sizes: tuple[int, ...], pingpong_repeats: int, run_timeout_s: float) -> dict[str, Any]:
    """Run on host 0: per world size, one group: ping-pong fit, then star and ring, interleaved, timed.

    Returns {"worlds": [{"N", "hosts", "pingpong": [[bytes, s], ...], "alpha_s", "bandwidth_Bps",
    "measured_s": {algorithm: median s}, "predicted_s": {algorithm: s}}, ...], "workers_ready_s", "measured_s"}.
    """
    import numpy as np

    from ..runtime.clusters.cluster import start_client
    from ..runtime.clusters.deployment import wait_for_workers
    from ..runtime.ranks.group import group_hosts
    from .cost_model import fit_alpha_beta, predict_seconds
    from .experiment import run_session
    from .session import Plan

    t0 = time.perf_counter()
    wait_for_workers(address, max(worlds))
    ready = time.perf_counter() - t0
    k = int(mib * 2**20) // 4
    per_world = []
    with start_client(scheduler=address, quiet=True) as client:
        for world in worlds:
            plan = Plan(jobs=tuple((a, k) for a in ALGORITHMS), repeats=repeats, warmup=1, seed=0,
                        pingpong_sizes=tuple(pingpong_sizes), pingpong_repeats=pingpong_repeats)
            spec, results, trace, _ = run_session(client, world, plan, device="cpu", timeout_s=120,
                                                     run_timeout_s=run_timeout_s)
            ping = results[0]["pingpong"]
            model = fit_alpha_beta(np.array([q[0] for q in ping]), np.array([q[1] for q in ping]))
            timed = trace[(trace.event == "allreduce") & (trace.worker == 0)]
            per_world.append({
                "N": world, "hosts": group_hosts(spec), "pingpong": [[int(b), float(t)] for b, t in ping],
                "alpha_s": model.alpha, "bandwidth_Bps": model.bandwidth,
                "measured_s": {a: statistics.median(timed[timed.algorithm == a].slowest_seconds) for a in ALGORITHMS},
                "predicted_s": {a: predict_seconds(model, a, world, k) for a in ALGORITHMS}})
    return {"worlds": per_world, "workers_ready_s": ready, "measured_s": time.perf_counter() - t0 - ready}


def shaped_allreduce(worlds: tuple[int, ...] = (3, 4), rate: str = "200mbit", mib: float = 4.0, repeats: int = 3,
                     timeout_s: float = 420.0) -> dict:
    """Chapter 05's cell: star against ring over hosts whose links are shaped to `rate`; everything removed after.

    Returns {"rate", "mib", "rows": [{"N", "algorithm", "measured_s", "predicted_s"}, ...], "alpha_us",
    "link_MBps", "hosts", "wall_s"}, or {"skipped": reason} where namespaces cannot be made (not root, Binder,
    another deployment).
    """
    reason = shaped_unavailable()
    if reason:
        return {"skipped": reason}
    t0 = time.perf_counter()
    # alpha from 1 KiB messages, beta from 256 KiB and 4 MiB: three sizes keep the session short
    out = measure_on_shaped_hosts(worlds, rate, mib, repeats, pingpong_sizes=(2**10, 2**18, 2**22),
                                  pingpong_repeats=2, run_timeout_s=300, timeout_s=timeout_s)
    rows = [{"N": w["N"], "algorithm": a, "measured_s": w["measured_s"][a], "predicted_s": w["predicted_s"][a]}
            for w in out["worlds"] for a in ALGORITHMS]
    return {"rate": rate, "mib": mib, "rows": rows, "alpha_us": [w["alpha_s"] * 1e6 for w in out["worlds"]],
            "link_MBps": [w["bandwidth_Bps"] / 1e6 for w in out["worlds"]], "hosts": [w["hosts"] for w in out["worlds"]],
            "workers_ready_s": out["workers_ready_s"], "measured_s": out["measured_s"],
            "wall_s": time.perf_counter() - t0}


def main(argv: list[str] | None = None) -> int:
    """`python -m dsgd_teach.collectives.shaped_links ADDRESS ...`, run on host 0: print measure_inside's JSON."""
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=main.__doc__)
    parser.add_argument("address")
    parser.add_argument("--worlds", type=int, nargs="+", default=[3, 4])
    parser.add_argument("--mib", type=float, default=4.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--pingpong-sizes", type=int, nargs="+", default=[2**10, 2**18, 2**22])
    parser.add_argument("--pingpong-repeats", type=int, default=2)
    parser.add_argument("--run-timeout", type=float, default=300.0)
    args = parser.parse_args(argv)
    print(json.dumps(measure_inside(args.address, tuple(args.worlds), args.mib, args.repeats,
                                    tuple(args.pingpong_sizes), args.pingpong_repeats, args.run_timeout)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
