"""Chapter 06 benchmark: intra-op speedup of a large matmul and inter-op speedup of the two-tower model.

Both at 2 threads against 1 thread measured in the same call, each setting in its own fresh process on a
cluster worker (medians of repeated perf_counter timings). On a 2-core machine both are capped at 2.0.
"""

from __future__ import annotations

from typing import Any

from ..runtime.clusters.cluster import cpu_count
from ..threads import InterOpConfig, IntraOpConfig, interop_table, run_inter_op, run_intra_op
from .runner import with_client

MATMUL = IntraOpConfig(ops=("matmul",), max_threads=2, size=2048, repeats=7, warmup=2)
TOWERS = InterOpConfig(max_interop_threads=2, intra_threads=1, width=1024, depth=6, batch=128, repeats=9, warmup=3)


def measure() -> dict[str, Any]:
    """Run both sweeps (1 and 2 threads) on a fresh 1-worker cluster; ratios compare within this call."""
    out: dict[str, Any] = {"cores": cpu_count()}
    with with_client(1) as client:
        intra = run_intra_op(MATMUL, client).summary
        inter_result = run_inter_op(TOWERS, client)
    inter = inter_result.summary
    ms = interop_table(inter_result.trace).set_index(["interop_threads", "variant"]).seconds * 1e3
    out["matmul_2048_1t_ms"] = round(intra["matmul_ms_1t"], 2)
    out["matmul_2048_2t_ms"] = round(intra["matmul_ms_1t"] / intra["matmul_speedup_2t"], 2)
    out["intra_op_matmul_speedup_2t_ratio"] = round(intra["matmul_speedup_2t"], 3)
    for i in (1, 2):
        for variant in ("sequential", "forked"):
            out[f"two_tower_{variant}_{i}i_ms"] = round(float(ms[(i, variant)]), 2)
    out["inter_op_two_tower_forked_2i_vs_1i_ratio"] = round(float(ms[(1, "forked")] / ms[(2, "forked")]), 3)
    out["inter_op_two_tower_forked_speedup_2i_ratio"] = round(inter["forked_speedup_2i"], 3)
    out["inter_op_two_tower_forked_speedup_1i_ratio"] = round(inter["forked_speedup_1i"], 3)
    out["inter_op_two_tower_fork_one_speedup_2i_ratio"] = round(inter["fork_one_speedup_2i"], 3)
    out["two_tower_max_abs_diff"] = inter["max_abs_diff"]
    return out


if __name__ == "__main__":
    print(measure())
