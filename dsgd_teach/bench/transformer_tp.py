"""Benchmark for chapter 10: the course's tensor (and sequence) parallel GPT step against PyTorch's own.

Both sides train the same GPT (built by `build_gpt(shape, seed)`, its blocks split over N_tp = 2 ranks) on the same
batches with plain SGD, over gloo on the CPU, one torch thread per rank, in the same two spawned processes: ours
(transformer/tensor_parallel.py, its collectives by chapter 05's ring or by the library's allreduce, all-gather and
reduce-scatter) and PyTorch's `parallelize_module` with ColwiseParallel / RowwiseParallel / SequenceParallel
(transformer/torch_tp.py). Each round runs every setting on both sides back to back, the side that goes first
alternating, so machine noise hits both alike. A side's step time is the median over a run's steps after the first;
quoted per setting: ours_over_torch_step_ratio (goal <= 1.1), the median over rounds of ours over the median over
rounds of torch's, each round's ratio beside it, and the largest difference between the two sides' final losses.
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import statistics
from typing import Any

from ..runtime.ranks.group import host_store, join_store
from ..transformer.model import GPTShape
from ..transformer.tensor_parallel import TPConfig

WORLD = 2
SHAPE = GPTShape(vocab=64, seq_len=64, width=128, heads=4, layers=2)
BASE = TPConfig(shape=SHAPE, tp=WORLD, batch=8, steps=12, lr=0.05, threads=1)
SETTINGS = [(sp, how) for sp in (False, True) for how in ("ring", "library")]
ROUNDS = 5


def _rank(rank: int, port: int, rounds: int, out: Any) -> None:
    """One rank: every round, every setting on both sides; puts (rank, {(setting, side): [step_s, ...]}, losses)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    from ..runtime.ranks.comm import Comm
    from ..transformer.tensor_group import TensorGroup
    from ..transformer.tensor_parallel import tp_rank
    from ..transformer.torch_tp import torch_tp_rank

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=join_store("127.0.0.1", port, WORLD), rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=300))
    try:
        mesh = DeviceMesh("cpu", list(range(WORLD)))
        times: dict[str, list[float]] = {}
        losses: dict[str, float] = {}
        for r in range(rounds):
            for i, (sp, how) in enumerate(SETTINGS):
                config = BASE.replace(sequence_parallel=sp, how=how)
                name = f"{'tp_sp' if sp else 'tp'}_{how}"
                for side in (("torch", "ours") if (r + i) % 2 else ("ours", "torch")):
                    if side == "ours":
                        group = TensorGroup(Comm(rank, WORLD, torch.device("cpu"), 120.0), how)
                        res = tp_rank(group, config, keep_grads=False)
                    else:
                        res = torch_tp_rank(config, mesh, keep_grads=False)
                    times.setdefault(f"{name}|{side}", []).append(statistics.median(res["step_s"][1:]))
                    losses[f"{name}|{side}"] = res["loss"][-1]
        out.put((rank, times, losses))
    except Exception as exc:  # reported by measure() instead of a wait that never ends
        out.put((rank, repr(exc), {}))
    finally:
        dist.destroy_process_group()


def measure(rounds: int = ROUNDS) -> dict[str, float | str]:
    """Per setting (TP or TP+SP, ring or library): our step time, torch's, ours over torch, loss agreement."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    store = host_store(WORLD)  # listening before the ranks start, on a port the OS gave it
    procs = [ctx.Process(target=_rank, args=(r, store.port, rounds, out), daemon=True) for r in range(WORLD)]
    for proc in procs:
        proc.start()
    try:
        got = {rank: (times, losses) for rank, times, losses in (out.get(timeout=1200) for _ in range(WORLD))}
    finally:
        for proc in procs:
            proc.join(timeout=60)
            if proc.is_alive():
                proc.kill()
    for rank, (times, _) in got.items():
        if not isinstance(times, dict):
            raise RuntimeError(f"rank {rank} failed: {times}")
    times, losses = got[0]
    figures: dict[str, float | str] = {}
    for sp, how in SETTINGS:
        name = f"{'tp_sp' if sp else 'tp'}_{how}"
        ours, theirs = times[f"{name}|ours"], times[f"{name}|torch"]
        a, b = statistics.median(ours), statistics.median(theirs)
        figures[f"{name}_ours_step_s"] = round(a, 5)
        figures[f"{name}_torch_step_s"] = round(b, 5)
        figures[f"{name}_ours_over_torch_step_ratio"] = round(a / b, 3)
        figures[f"{name}_ratio_per_round"] = " ".join(f"{x / y:.2f}" for x, y in zip(ours, theirs, strict=True))
        # SP's loss is rank 0's share; both sides compute the same share
        figures[f"{name}_final_loss_abs_diff"] = float(f"{abs(losses[f'{name}|ours'] - losses[f'{name}|torch']):.3g}")
    figures["rounds"] = rounds
    figures["setting"] = (f"N_tp={WORLD}, V={SHAPE.vocab} s={SHAPE.seq_len} h={SHAPE.width} a={SHAPE.heads} "
                          f"L={SHAPE.layers}, B={BASE.batch}, {BASE.steps} SGD steps, gloo, 1 thread per rank")
    return figures


if __name__ == "__main__":
    print(measure())
