"""Benchmark figure for the delay-tolerant rules (McMahan & Streeter 2014), in the simulator with real gradients.

Final training loss after the same number of updates, AdaGrad against AdaRevision, over 5 seeds (mean and sd), at
small delays (4 workers, ~3 updates) and at delays of ~1000 updates (1200 equal-speed asynchronous workers), all
at one learning rate. These are losses, not speeds: they do not depend on the machine.
"""

from __future__ import annotations

from typing import Any

from ..config import sized
from ..sim.papers import delay_summary, delay_tolerance

LR = 0.1


def measure() -> dict[str, Any]:
    """Mean and sd over seeds of the final loss for each (delay, rule), and the mean delay observed."""
    runs = delay_tolerance(
        workers=sized((4, 1200), (4, 200)), seeds=sized((0, 1, 2, 3, 4), (0, 1)), steps=sized(5000, 400), lr=LR,
    )
    out: dict[str, Any] = {"lr": LR, "updates": int(sized(5000, 400))}
    for row in delay_summary(runs).itertuples():
        key = f"n{row.workers}_{row.optimizer}"
        out[f"{key}_mean_delay"] = round(float(row.mean_delay), 1)
        out[f"{key}_loss_mean"] = round(float(row.loss_mean), 4)
        out[f"{key}_loss_sd"] = round(float(row.loss_sd), 4)
    return out


if __name__ == "__main__":
    import json

    print(json.dumps(measure(), indent=2))
