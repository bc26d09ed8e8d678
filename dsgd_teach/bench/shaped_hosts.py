"""Benchmark for chapter 05 on shaped links: ring against star (naive) over emulated hosts at 200 Mbit/s.

Five emulated hosts (dsgd_teach.runtime.hosts): the scheduler and the driver on host 0, one `dask worker` on each of hosts
1-4, every link a token bucket of RATE. At N = 3 and 4 ranks and a message of MIB MiB, the figures to quote are
star_over_ring_{N}ranks_ratio (> 1: the ring wins, as the alpha-beta model predicts) and
model_error_{algorithm}_{N}ranks (|predicted - measured| / measured, goal <= 0.25), with alpha and beta fitted
from a ping-pong between two ranks in the same session. Needs root; elsewhere it reports why it was skipped.

What made the ring lose before: every emulated host is a separate address, so the course's worker settings gave
each worker all the machine's cores as torch threads; four ranks on two cores then fought with spinning OpenMP
threads at every reduce of every ring step (the star adds on one rank only). Threads are now shared per machine
(dsgd_teach/runtime/worker_settings.py) and the workers here also start with OMP_NUM_THREADS=1. The emulation itself
holds: a plain TCP flow, alone or three at once around a ring, reaches 23.9 MB/s of the 25 MB/s (200 Mbit/s,
headers included), and a gloo ring step outside dask matches the fitted model. On a shared 2-core machine the ring,
whose ranks all need a core at once, is the figure most disturbed by other load. README's benchmark table (a full
`make bench`, run started 2026-11-23 15:24 UTC on a 2-core machine; chapter 05 quotes it) measured star/ring 2.70
(N = 3) and 3.50 (N = 4); model error star 7 % and 6 %, ring 16 % and 17 %. An earlier run gave 2.8 and 3.3, and
the ring's model error at N = 4 reached 36 % while another process took 1.5 of the 2 cores.
"""

from __future__ import annotations

import json
import statistics
import sys
from typing import Any

RATE = "200mbit"
MIB = 4
WORLDS = (3, 4)
ALGORITHMS = ("naive", "ring")


def _inside(address: str) -> dict[str, Any]:
    """Run on host 0: one session per world size; fit the link from the ping-pong, time star and ring."""
    import numpy as np

    from ..collectives.cost_model import fit_alpha_beta, predict_seconds
    from ..collectives.experiment import run_session
    from ..collectives.session import Plan
    from ..runtime.cluster import start_client
    from ..runtime.deployment import wait_for_workers
    from ..runtime.group import group_hosts

    wait_for_workers(address, max(WORLDS))
    k = MIB * 2**20 // 4
    figures: dict[str, Any] = {"rate": RATE, "message_MiB": float(MIB)}
    with start_client(scheduler=address, quiet=True) as client:
        for world in WORLDS:
            plan = Plan(jobs=tuple((a, k) for a in ALGORITHMS), repeats=5, warmup=1, seed=0,
                        pingpong_sizes=tuple(2**e for e in range(10, 23, 2)), pingpong_repeats=3)
            spec, results, recorder, _ = run_session(client, world, plan, device="cpu", timeout_s=120,
                                                     run_timeout_s=480)
            ping = results[0]["pingpong"]
            model = fit_alpha_beta(np.array([p[0] for p in ping]), np.array([p[1] for p in ping]))
            trace = recorder.frame()
            timed = trace[(trace.event == "allreduce") & (trace.worker == 0)]
            measured = {a: statistics.median(timed[timed.algorithm == a].slowest_seconds) for a in ALGORITHMS}
            figures[f"hosts_{world}ranks"] = group_hosts(spec)
            figures[f"pingpong_ms_{world}ranks"] = " ".join(f"{b}:{t * 1e3:.2f}" for b, t in ping)
            figures[f"alpha_us_{world}ranks"] = round(model.alpha * 1e6, 1)
            figures[f"link_MBps_{world}ranks"] = round(model.bandwidth / 1e6, 2)
            for a in ALGORITHMS:
                predicted = predict_seconds(model, a, world, k)
                figures[f"{a}_measured_s_{world}ranks"] = round(measured[a], 4)
                figures[f"{a}_predicted_s_{world}ranks"] = round(predicted, 4)
                figures[f"model_error_{a}_{world}ranks"] = round(abs(predicted - measured[a]) / measured[a], 3)
            figures[f"star_over_ring_{world}ranks_ratio"] = round(measured["naive"] / measured["ring"], 3)
    return figures


def measure() -> dict[str, float | str]:
    """Make the shaped hosts, start dask on them with its CLI, measure from host 0, tear everything down."""
    from ..runtime import hosts

    reason = hosts.available()
    if reason:
        return {"skipped": f"shaped hosts need network namespaces: {reason}"}
    with hosts.shaped_deployment(1 + max(WORLDS), RATE) as (h, dep):
        proc = h.run(0, sys.executable, "-m", "dsgd_teach.bench.shaped_hosts", dep.address,
                     capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            return {"error": f"measuring on the shaped hosts failed: {proc.stderr[-2000:]}"}
        figures = json.loads(proc.stdout.strip().splitlines()[-1])
        figures["tcp_retransmits"] = float(hosts.retransmits(h))
        return figures

if __name__ == "__main__":
    print(json.dumps(_inside(sys.argv[1])))
