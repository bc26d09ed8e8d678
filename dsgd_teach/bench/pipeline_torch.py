"""Benchmark for chapter 07: our pipelines against torch.distributed.pipelining on the same work.

Both sides train the same 8-layer MLP, cut into the same p = 2 stages, on the same batches (48 steps of 512 digits
rows, cut into m = 4 or 8 microbatches), with plain SGD, over gloo on the CPU, one torch thread per rank: ours with
run_pipeline on a two-worker dask cluster, as a learner runs it (each stage pinned to a core of its own, the
default pin_stages=True), torch's with PipelineStage and ScheduleGPipe / Schedule1F1B in two processes of their own
(kept for the whole benchmark; torch's pipelining does not pin its ranks). Each round runs every setting on both sides back to back
(the side that goes first alternates), so machine noise hits both alike. A side's step time is the median period between the starts of consecutive steps on
stage 0, after a warm-up step; quoted per setting: ours_over_torch_step_ratio (goal <= 1.0), the median over
rounds of ours over the median over rounds of torch's, with each round's ratio and their median (the paired
figure: machine drift between rounds cancels) beside it, and the largest
difference between the two sides' final parameters (the same training: float rounding only).
"""

from __future__ import annotations

import multiprocessing as mp
import statistics
import time
from typing import Any

import numpy as np

from ..pipeline import PipelineConfig, run_pipeline
from ..runtime.clusters.cluster import start_client
from ..runtime.ranks.group import host_store, join_store

BASE = PipelineConfig(stages=2, depth=8, batch_size=512, steps=48, lr=0.01, device="cpu", timeout_s=60)
SETTINGS = [(schedule, m, hidden) for schedule in ("gpipe", "1f1b") for hidden in (64, 512) for m in (4, 8)]
ROUNDS = 7


def _config(schedule: str, m: int, hidden: int) -> PipelineConfig:
    """The benchmark's model and batches with one setting's schedule, microbatches and width."""
    return BASE.replace(schedule=schedule, microbatches=m, hidden=hidden)


def _ours(client: Any, schedule: str, m: int, hidden: int) -> tuple[float, np.ndarray]:
    """Median step period of our pipeline on stage 0, and its final parameters."""
    result = run_pipeline(_config(schedule, m, hidden), client)
    trace = result.trace
    starts = trace[(trace.event == "forward") & (trace.worker == 0)].groupby("step").t_start.min().sort_index()
    return float(np.median(np.diff(starts.to_numpy())[1:])), result.params


def _torch_rank(rank: int, port: int, commands: Any, out: Any) -> None:
    """One rank of torch's pipeline: runs each setting it is sent; puts (rank, step period, parameters)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    from ..pipeline import build_units
    from ..pipeline.rank_support import training_data
    from ..pipeline.stages import flat_params, stage_module
    from ..sampling import batch_indices

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=join_store("127.0.0.1", port, 2), rank=rank, world_size=2)
    try:
        for schedule, m, hidden in iter(commands.get, None):
            config = _config(schedule, m, hidden)
            X_all, y_all = training_data(config)
            units = build_units(config.model, X_all.shape[1], 10, config.depth, config.hidden, config.seed)
            module = stage_module(units, 2, rank)
            stage = PipelineStage(module, rank, 2, torch.device("cpu"))
            kind = ScheduleGPipe if schedule == "gpipe" else Schedule1F1B
            pipe = kind(stage, n_microbatches=m, loss_fn=torch.nn.functional.cross_entropy)
            opt = torch.optim.SGD(module.parameters(), lr=config.lr)
            starts = []
            for step in range(config.steps):
                idx = batch_indices(len(y_all), config.batch_size, step, config.seed)
                starts.append(time.perf_counter())
                opt.zero_grad(set_to_none=True)
                if rank == 0:
                    pipe.step(torch.as_tensor(X_all[idx]))
                else:
                    pipe.step(target=torch.as_tensor(y_all[idx]))
                opt.step()
            dist.barrier()
            out.put((rank, float(np.median(np.diff(starts)[1:])), flat_params(module), torch.get_num_threads()))
    finally:
        dist.destroy_process_group()


class TorchPipeline:
    """torch.distributed.pipelining's two ranks in processes of their own, kept for every run of the benchmark."""

    def __enter__(self) -> TorchPipeline:
        ctx = mp.get_context("spawn")
        self.out = ctx.Queue()
        self.commands = [ctx.Queue() for _ in range(2)]
        self.store = host_store(2)  # listening before the ranks start, on a port the OS gave it
        port = self.store.port
        self.procs = [ctx.Process(target=_torch_rank, args=(r, port, self.commands[r], self.out), daemon=True)
                      for r in range(2)]
        for proc in self.procs:
            proc.start()
        return self

    def run(self, setting: tuple[str, int, int]) -> tuple[float, np.ndarray, int]:
        """Train one setting: rank 0's step period, both stages' parameters, and rank 0's torch threads."""
        for q in self.commands:
            q.put(setting)
        got = dict((rank, (period, params, threads)) for rank, period, params, threads in
                   (self.out.get(timeout=600) for _ in range(2)))
        return got[0][0], np.concatenate([got[0][1], got[1][1]]), got[0][2]

    def __exit__(self, *exc: object) -> None:
        for q in self.commands:
            q.put(None)
        for proc in self.procs:
            proc.join(timeout=60)
            if proc.is_alive():
                proc.kill()


def measure(rounds: int = ROUNDS) -> dict[str, float | str]:
    """Per setting: our step time, torch's, ours over torch (median of interleaved rounds), parameter agreement."""
    ours: dict[tuple[str, int, int], list[float]] = {k: [] for k in SETTINGS}
    theirs: dict[tuple[str, int, int], list[float]] = {k: [] for k in SETTINGS}
    ours_params: dict[tuple[str, int, int], np.ndarray] = {}
    torch_params: dict[tuple[str, int, int], np.ndarray] = {}
    with start_client(2, quiet=True, use_gpu=False) as client, TorchPipeline() as torch_pipe:
        for r in range(rounds):
            for i, k in enumerate(SETTINGS):  # each setting on both sides back to back, the first side alternating
                for side in (("torch", "ours") if (r + i) % 2 else ("ours", "torch")):
                    if side == "torch":
                        period, torch_params[k], torch_threads = torch_pipe.run(k)
                        theirs[k].append(period)
                    else:
                        period, ours_params[k] = _ours(client, *k)
                        ours[k].append(period)
        ours_threads = sorted(set(client.run(_torch_threads).values()))
    figures: dict[str, float | str] = {}
    for k in SETTINGS:
        name = f"{k[0]}_m{k[1]}_h{k[2]}"
        a, b = statistics.median(ours[k]), statistics.median(theirs[k])
        figures[f"{name}_ours_step_s"] = round(a, 5)
        figures[f"{name}_torch_step_s"] = round(b, 5)
        figures[f"{name}_ours_over_torch_step_ratio"] = round(a / b, 3)
        per_round = [x / y for x, y in zip(ours[k], theirs[k], strict=True)]  # each round's pair ran back to back
        figures[f"{name}_ratio_per_round"] = " ".join(f"{r:.2f}" for r in per_round)
        figures[f"{name}_median_round_ratio"] = round(statistics.median(per_round), 3)
        figures[f"{name}_params_max_abs_diff"] = float(f"{np.max(np.abs(ours_params[k] - torch_params[k])):.3g}")
    figures["rounds"] = rounds
    figures["torch_threads_per_rank"] = f"ours {ours_threads}, torch's {torch_threads}"
    return figures


def _torch_threads() -> int:
    """torch's intra-op threads in this process (run on each dask worker)."""
    import torch

    return torch.get_num_threads()


if __name__ == "__main__":
    print(measure())
