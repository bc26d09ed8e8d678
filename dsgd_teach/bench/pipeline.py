"""Benchmark for chapter 07: GPipe's step time against the naive schedule, p = 2 stages, m = 8 microbatches.

Both schedules train the same model on the same batches in the same cluster, interleaved (naive, GPipe, naive,
GPipe, ...) so machine noise hits both alike. Quoted: gpipe_over_naive_step_ratio (goal >= 1.5; ideal 2m/(m+1) =
1.78 when the two stages run on cores of their own) and the measured GPipe bubble against (p-1)/(m+p-1) = 1/9
(goal: within 15 %); each round's ratio is listed too, to show its spread. The bubble is the idle fraction of both
stages together; the busiest stage's own idle fraction is quoted beside it, to tell the schedule's bubble from
stages of unequal speed, and the part of the bubble spent waiting (at the ends of the step or blocked on a
message), to tell it from the per-message overhead between actions, and the bubble of the same steps replayed with
their measured action times but free messages (gpipe_bubble_free_messages): above the formula only because actions
were of unequal length. Decoupled backprop (gradient delay 1) runs in the same rounds: its step time against
GPipe's (gpipe_over_decoupled_step_ratio, > 1 when unlocking the backwards pays) and its bubble against its own
ideal.
"""

from __future__ import annotations

import statistics

import torch

from ..pipeline import PipelineConfig, run_pipeline
from ..runtime.clusters.cluster import start_client
from ..sim.pipeline import bubble_with_free_messages

CONFIG = PipelineConfig(stages=2, microbatches=8, depth=8, hidden=512, batch_size=512, steps=6, lr=0.01,
                        device="cpu", timeout_s=60)


def _measure(device: str, rounds: int = 3) -> dict[str, float]:
    """Median step time of naive and GPipe over `rounds` interleaved runs, and GPipe's median bubble."""
    steps: dict[str, list[float]] = {"naive": [], "gpipe": [], "decoupled": []}
    bubbles: list[float] = []
    busiest: list[float] = []
    waiting: list[float] = []
    replayed: list[float] = []
    decoupled: list[tuple[float, float]] = []
    with start_client(2, quiet=True, use_gpu=device == "cuda") as client:
        for _ in range(rounds):
            for schedule in ("naive", "gpipe", "decoupled"):
                result = run_pipeline(CONFIG.replace(schedule=schedule, device=device, gradient_delay=1), client)
                steps[schedule].append(result.summary["median_step_s"])
                if schedule == "decoupled":
                    decoupled.append((result.summary["bubble"], result.summary["ideal_bubble"]))
                if schedule == "gpipe":
                    bubbles.append(result.summary["bubble"])
                    busiest.append(result.summary["bubble_busiest_stage"])
                    waiting.append(result.summary["bubble_waiting"])
                    replayed.append(bubble_with_free_messages(result.trace, result.config))
                    ideal = result.summary["ideal_bubble"]
    naive, gpipe, bubble = statistics.median(steps["naive"]), statistics.median(steps["gpipe"]), statistics.median(bubbles)
    return {"naive_step_s": round(naive, 4), "gpipe_step_s": round(gpipe, 4),
            "gpipe_over_naive_step_ratio": round(naive / gpipe, 3),
            "gpipe_over_naive_step_ratio_per_round": " ".join(
                f"{n / g:.2f}" for n, g in zip(steps["naive"], steps["gpipe"], strict=True)),
            "gpipe_bubble": round(bubble, 4), "ideal_bubble": round(ideal, 4),
            "gpipe_bubble_over_ideal_ratio": round(bubble / ideal, 3),
            "gpipe_bubble_busiest_stage": round(statistics.median(busiest), 4),
            "gpipe_bubble_waiting": round(statistics.median(waiting), 4),
            "gpipe_bubble_free_messages": round(statistics.median(replayed), 4),
            "decoupled_step_s": round(statistics.median(steps["decoupled"]), 4),
            "gpipe_over_decoupled_step_ratio": round(gpipe / statistics.median(steps["decoupled"]), 3),
            "decoupled_bubble": round(statistics.median(b for b, _ in decoupled), 4),
            "decoupled_ideal_bubble": round(statistics.median(i for _, i in decoupled), 4)}


def measure() -> dict[str, float | str]:
    """CPU (gloo) always; CUDA (NCCL) too when the machine has a GPU for each of the two stages."""
    figures: dict[str, float | str] = {f"cpu_{k}": v for k, v in _measure("cpu").items()}
    if torch.cuda.device_count() >= 2:
        figures.update({f"cuda_{k}": v for k, v in _measure("cuda").items()})
    else:
        figures["cuda"] = "not measured: fewer than two GPUs"
    return figures


if __name__ == "__main__":
    print(measure())
