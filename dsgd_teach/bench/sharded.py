"""Benchmark for chapter 09: our overlapped bucketed DDP step against torch's DistributedDataParallel.

A 5.3 M-parameter MLP (7 Linear layers of width 1024) on 2 gloo ranks, 25 MiB buckets (torch's default cap) and
one bucket per tensor. In every run each step of ours is paired with the same step of torch's DDP on a copy of
the model in the same process group, the order alternating step by step, so machine noise hits both alike.
The figures to quote: overlapped_vs_torch_ddp_ratio (same 25 MiB cap as torch's; goal <= 1.1) and overlap_ratio, the overlapped step over
backward + allreduce run back to back (below 1 when the overlap pays).
"""

from __future__ import annotations

import statistics
from typing import Any

from ..sharded import DDPConfig, run_ddp
from .runner import with_client

MODEL = {"width": 1024, "depth": 7, "batch_size": 32}


def _round(client: Any, overlap: bool, bucket_mb: float, steps: int) -> dict[str, float]:
    """Median step times (ms) of ours and torch's, interleaved, and of ours' backward and allreduces."""
    r = run_ddp(DDPConfig(allreduce="library", bucket_mb=bucket_mb, overlap=overlap, steps=steps, compare_torch=True,
                          **MODEL), client)
    t = r.trace[r.trace.step >= 2]  # the first steps warm up caches and connections
    ups, ref = t[t.event == "update"], t[t.event == "torch_ddp"]
    bwd = t[t.event == "backward"]
    comm = t[t.event == "bucket"].assign(s=lambda d: d.end - d.start).groupby(["step", "worker"]).s.sum()
    return {"ours_ms": statistics.median(ups.step_s) * 1e3, "torch_ms": statistics.median(ref.step_s) * 1e3,
            "backward_ms": statistics.median(bwd.end - bwd.start) * 1e3, "allreduce_ms": float(comm.median()) * 1e3,
            "params": r.summary["params"], "max_diff": r.summary["max_diff_vs_torch_ddp"]}


def measure() -> dict[str, float | str]:
    """Interleaved rounds of overlapped (25 MiB and per-tensor buckets) and back-to-back DDP, each next to torch's."""
    rounds: dict[str, list[dict[str, float]]] = {"overlap_25mb": [], "overlap_per_tensor": [], "back_to_back": []}
    with with_client(2) as client:
        run_ddp(DDPConfig(steps=2, **MODEL), client)  # warm-up: imports and first connections
        for _ in range(3):
            rounds["overlap_25mb"].append(_round(client, True, 25.0, 12))
            rounds["overlap_per_tensor"].append(_round(client, True, 0.0, 12))
            rounds["back_to_back"].append(_round(client, False, 0.0, 12))
    med = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in rounds.items()}
    b2b = med["back_to_back"]
    figures: dict[str, float | str] = {
        "params": float(med["overlap_25mb"]["params"]), "ranks": 2.0, "backend": "gloo",
        "overlapped_25mb_step_ms": round(med["overlap_25mb"]["ours_ms"], 2),
        "overlapped_per_tensor_step_ms": round(med["overlap_per_tensor"]["ours_ms"], 2),
        "torch_ddp_step_ms": round(med["overlap_25mb"]["torch_ms"], 2),
        "overlapped_25mb_vs_torch_ddp_ratio": round(med["overlap_25mb"]["ours_ms"] / med["overlap_25mb"]["torch_ms"], 3),
        "overlapped_per_tensor_vs_torch_ddp_ratio": round(
            med["overlap_per_tensor"]["ours_ms"] / med["overlap_per_tensor"]["torch_ms"], 3),
        "overlapped_vs_torch_ddp_ratio": round(med["overlap_25mb"]["ours_ms"] / med["overlap_25mb"]["torch_ms"], 3),
        "back_to_back_backward_ms": round(b2b["backward_ms"], 2),
        "back_to_back_allreduce_ms": round(b2b["allreduce_ms"], 2),
        "overlap_ratio": round(med["overlap_per_tensor"]["ours_ms"] / (b2b["backward_ms"] + b2b["allreduce_ms"]), 3),
        "max_param_diff_vs_torch_ddp": max(m["max_diff"] for m in med.values()),
    }
    return figures


if __name__ == "__main__":
    print(measure())
