"""Benchmark for chapter 09's ZeRO: each stage's Adam step against PyTorch's own at N = 2 and 4 gloo ranks.

Stage 0 against DistributedDataParallel with Adam, stages 1 and 2 against DDP with ZeroRedundancyOptimizer, stage 2
also against fully_shard with reshard_after_forward=False, stage 3 against fully_shard. In
every rank both train the same MLP on the same batches, step by step in alternating order, one torch thread per
rank, so load on the machine hits both alike. A figure is the median over steps 2.. and ranks of our step time over
theirs in the same step (`*_ratio`, goal <= 1.1; stage 3 <= 1.0); the parameters must agree (`max_param_diff`).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from ..runtime.ranks.comm import Comm
from ..runtime.ranks.group import plan_group, run_in_group
from ..runtime.ranks.live import WorkerContext
from ..sharded.toy import batch, flat_params, make_mlp
from ..sharded.zero import ZeroAdam
from ..trace import TraceRecorder
from .runner import with_client

MODEL = {"width": 512, "depth": 6}
ROWS, STEPS, LR = 32, 14, 1e-3
#: (our stage, PyTorch's counterpart)
PAIRS = ((0, "ddp_adam"), (1, "zero_redundancy"), (2, "zero_redundancy"), (2, "fully_shard_no_reshard"),
         (3, "fully_shard"))


def _theirs(kind: str, model: torch.nn.Module) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """PyTorch's own implementation of `kind` around model, and its optimizer."""
    if kind.startswith("fully_shard"):
        from torch.distributed.fsdp import fully_shard

        reshard = kind == "fully_shard"
        for m in model:
            if isinstance(m, torch.nn.Linear):
                fully_shard(m, reshard_after_forward=reshard)
        fully_shard(model, reshard_after_forward=reshard)
        return model, torch.optim.Adam(model.parameters(), lr=LR, foreach=False)
    wrapped = torch.nn.parallel.DistributedDataParallel(model)
    if kind == "zero_redundancy":
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return wrapped, ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=LR,
                                                foreach=False)
    return wrapped, torch.optim.Adam(model.parameters(), lr=LR, foreach=False)


def _pair(ctx: WorkerContext, comm: Comm, stage: int, kind: str) -> dict[str, Any]:
    """Step times of ours and theirs, interleaved, and the largest parameter difference at the end."""
    torch.set_num_threads(1)
    ours_model = make_mlp(**MODEL)
    zero = ZeroAdam(ours_model, comm, stage, "library", lr=LR)
    theirs_model, opt = _theirs(kind, make_mlp(**MODEL))
    times: dict[str, list[float]] = {"ours": [], "theirs": []}

    def ours(x: torch.Tensor, y: torch.Tensor) -> None:
        torch.nn.functional.mse_loss(ours_model(x), y).backward()
        zero.step()

    def theirs(x: torch.Tensor, y: torch.Tensor) -> None:
        opt.zero_grad()
        torch.nn.functional.mse_loss(theirs_model(x), y).backward()
        opt.step()

    for step in range(STEPS):
        x, y = batch(0, step, comm.rank, ROWS)
        for name, fn in (("ours", ours), ("theirs", theirs))[::1 if step % 2 else -1]:
            t0 = time.perf_counter()
            fn(x, y)
            times[name].append(time.perf_counter() - t0)
    mine = zero.full_params()
    zero.close()
    if kind.startswith("fully_shard"):
        other = torch.cat([p.full_tensor().detach().reshape(-1) for p in theirs_model.parameters()])
    else:
        other = flat_params(theirs_model)
    return {"ratios": [a / b for a, b in zip(times["ours"][2:], times["theirs"][2:], strict=True)],
            "ours_ms": statistics.median(times["ours"][2:]) * 1e3,
            "theirs_ms": statistics.median(times["theirs"][2:]) * 1e3,
            "max_diff": float((mine - other).abs().max())}


def measure(rounds: int = 3) -> dict[str, float | str]:
    """Every (stage, counterpart) at N = 2 and 4, `rounds` interleaved rounds; paired medians."""
    figures: dict[str, float | str] = {"backend": "gloo", "torch_threads_per_rank": 1.0, "rounds": float(rounds),
                                       "params": float(sum(p.numel() for p in make_mlp(**MODEL).parameters()))}
    for world in (2, 4):
        with with_client(world) as client:
            got: dict[tuple[int, str], list[dict[str, Any]]] = {pair: [] for pair in PAIRS}
            for _ in range(rounds):
                for stage, kind in PAIRS:
                    spec = plan_group(client, world, "cpu", 120.0)
                    outs, _ = run_in_group(client, spec, _pair, [(stage, kind)] * world, TraceRecorder(), 900.0)
                    got[(stage, kind)].extend(outs)
            for (stage, kind), outs in got.items():
                name = f"n{world}_stage{stage}_vs_{kind}"
                figures[f"{name}_ratio"] = round(statistics.median(r for o in outs for r in o["ratios"]), 3)
                figures[f"{name}_ours_ms"] = round(statistics.median(o["ours_ms"] for o in outs), 2)
                figures[f"{name}_theirs_ms"] = round(statistics.median(o["theirs_ms"] for o in outs), 2)
                figures[f"{name}_max_param_diff"] = max(o["max_diff"] for o in outs)
    return figures


if __name__ == "__main__":
    print(measure())
