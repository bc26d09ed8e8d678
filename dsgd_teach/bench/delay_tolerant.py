"""Benchmark figure for the delay-tolerant rules (McMahan & Streeter 2014), in the simulator with real gradients.

Final training loss after the same 3000 updates, AdaGrad against AdaRevision on the sparse logistic regression,
over 5 seeds (mean and sd), at small delays (4 workers, ~3 updates) and at delays of ~1000 updates (1400
equal-speed asynchronous workers), all at one learning rate (0.5, batch 8). These are losses, not speeds: they do
not depend on the machine (only the wall time to compute them does: ~30 min on a 2-core machine shared six ways).
"""

from __future__ import annotations

from typing import Any

from ..config import sized
from ..sim.papers import delay_summary, delay_tolerance

LR = 0.5


def measure() -> dict[str, Any]:
    """Mean and sd over seeds of the final loss for each (delay, rule), and the mean delay observed."""
    steps = sized(3000, 400)
    runs = delay_tolerance(workers=sized((4, 1400), (4, 200)), seeds=sized((0, 1, 2, 3, 4), (0, 1)), steps=steps, lr=LR)
    out: dict[str, Any] = {"lr": LR, "updates": int(steps)}
    for row in delay_summary(runs).itertuples():
        key = f"n{row.workers}_{row.optimizer}"
        out[f"{key}_mean_delay"] = round(float(row.mean_delay), 1)
        out[f"{key}_loss_mean"] = round(float(row.loss_mean), 4)
        out[f"{key}_loss_sd"] = round(float(row.loss_sd), 4)
    return out


if __name__ == "__main__":
    import json

    print(json.dumps(measure(), indent=2))
