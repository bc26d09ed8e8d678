"""Benchmark for chapter 10: how well the step-time prediction holds, over a sweep of layouts on this machine.

One cluster of 8 single-threaded workers; chapter 10's calibration once (the model's step at two batch sizes, ring
attention's blocks, the cores, the idle ping-pong, and α, β and the compute share among 2, 4 and 8 busy ranks in
rings of each axis size); then each of LAYOUTS (16 layouts of 1 to 8
ranks: data, tensor with and without sequence parallelism, pipeline, context, and their compositions) trains the
smoke-size GPT for STEPS steps with `transformer.experiment.run`, which predicts before it trains. Quoted:
step_within_25pct_share_ratio (the share of layouts whose predicted step time is within ±25 % of the measured,
goal >= 0.8), memory_within_10pct_share_ratio (held memory within ±10 %, goal 1.0), and each layout's predicted
over measured step time; the table and the load beside it go to docs/benchmarks.md.
"""

from __future__ import annotations

import os
import statistics
from typing import Any

from ..transformer.experiment import SMOKE_SHAPE, TransformerConfig, calibrate, run
from .runner import with_client

LAYOUTS: tuple[dict[str, Any], ...] = (
    {}, {"dp": 2}, {"tp": 2}, {"tp": 2, "sequence_parallel": True}, {"pp": 2}, {"cp": 2}, {"dp": 4}, {"tp": 4},
    {"dp": 2, "tp": 2}, {"pp": 2, "cp": 2}, {"dp": 2, "pp": 2}, {"tp": 2, "pp": 2}, {"dp": 2, "cp": 2},
    {"dp": 2, "tp": 2, "pp": 2}, {"tp": 2, "pp": 2, "cp": 2, "sequence_parallel": True}, {"dp": 8},
)
STEPS = 10


def layout_name(layout: dict[str, Any]) -> str:
    """'dp2·tp2' for {"dp": 2, "tp": 2}; '+SP' for sequence parallelism; 'single' for one rank."""
    name = "·".join(f"{k}{v}" for k, v in layout.items() if k != "sequence_parallel") or "single"
    return name + ("+SP" if layout.get("sequence_parallel") else "")


def measure() -> dict[str, float | str]:
    """Predicted over measured step time and memory for every layout, and the shares within the goals."""
    figures: dict[str, float | str] = {"layouts": float(len(LAYOUTS)), "steps": float(STEPS)}
    step_ratios, memory_ratios, loads = [], [], []
    with with_client(8) as client:
        cal = calibrate(client, SMOKE_SHAPE, refresh=True)
        figures["busy_alpha_ms"] = " ".join(f"{n}/{g}:{link.alpha * 1e3:.2f}" for n, g, link in cal.busy_links)
        figures["busy_beta_ns_per_byte"] = " ".join(f"{n}/{g}:{link.beta * 1e9:.2f}" for n, g, link in cal.busy_links)
        figures["compute_share"] = " ".join(f"{n}:{share:.2f}" for n, share in cal.shares)
        figures["ring_attention_ms"] = f"fixed {cal.ring_fixed_s * 1e3:.2f}, per block {cal.ring_block_s * 1e3:.2f}"
        for layout in LAYOUTS:
            result = run(TransformerConfig(shape=SMOKE_SHAPE, steps=STEPS, verbose=False, **layout), client)
            table = result.extras.comparison.set_index("quantity")
            step = float(table.loc["step time (s)", "ratio"])
            memory = float(table.loc["memory held (bytes)", "ratio"])
            name = layout_name(layout)
            figures[f"{name}_predicted_over_measured_step_ratio"] = round(step, 3)
            figures[f"{name}_measured_step_ms"] = round(float(table.loc["step time (s)", "measured"]) * 1e3, 2)
            step_ratios.append(step)
            memory_ratios.append(memory)
            loads.append(os.getloadavg()[0])
    figures["step_within_25pct_share_ratio"] = round(sum(0.75 <= r <= 1.25 for r in step_ratios) / len(step_ratios), 3)
    figures["memory_within_10pct_share_ratio"] = round(sum(0.9 <= r <= 1.1 for r in memory_ratios) / len(memory_ratios), 3)
    figures["median_predicted_over_measured_step_ratio"] = round(statistics.median(step_ratios), 3)
    figures["load_average_during"] = f"{min(loads):.1f}-{max(loads):.1f}"
    return figures


if __name__ == "__main__":
    print(measure())
