"""A two-tower model whose branches are independent: run one after the other, or forked onto the inter-op pool.

In TorchScript, `torch.jit.fork` hands a call to the inter-op thread pool and returns a future at once;
`torch.jit.wait` joins it. Called from eager Python, the same `fork` runs the function on the spot, in the calling
thread, and returns an already completed future: `eager_fork_demo` shows exactly that.
"""

from __future__ import annotations

import threading
import time
import warnings
from typing import Any

import torch
from torch import nn

from .workloads import Bench


class Tower(nn.Module):
    """`depth` layers of Linear(width, width) + tanh."""

    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        self.layers = nn.Sequential(*[m for _ in range(depth) for m in (nn.Linear(width, width), nn.Tanh())])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class TwoTower(nn.Module):
    """Two towers on the same input, outputs concatenated; three ways to schedule the two branches."""

    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        self.left = Tower(width, depth)
        self.right = Tower(width, depth)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.sequential(x)

    @torch.jit.export
    def sequential(self, x: torch.Tensor) -> torch.Tensor:
        """Left tower, then right tower, on the calling thread."""
        return torch.cat([self.left(x), self.right(x)], dim=1)

    @torch.jit.export
    def forked(self, x: torch.Tensor) -> torch.Tensor:
        """Both towers forked onto the inter-op pool: with one pool thread they still run one after the other."""
        a = torch.jit.fork(self.left, x)
        b = torch.jit.fork(self.right, x)
        return torch.cat([torch.jit.wait(a), torch.jit.wait(b)], dim=1)

    @torch.jit.export
    def fork_one(self, x: torch.Tensor) -> torch.Tensor:
        """Left tower forked, right tower on the calling thread: the caller is a worker too."""
        a = torch.jit.fork(self.left, x)
        b = self.right(x)
        return torch.cat([torch.jit.wait(a), b], dim=1)

    @torch.jit.export
    def launch_left(self, x: torch.Tensor) -> torch.jit.Future[torch.Tensor]:
        """Fork the left tower and hand the future back to Python (to show that fork returns immediately)."""
        return torch.jit.fork(self.left, x)


def build(width: int, depth: int, batch: int, seed: int) -> tuple[TwoTower, torch.jit.ScriptModule, torch.Tensor]:
    """The eager model, its TorchScript version (same parameters) and an input batch, all from `seed`."""
    torch.manual_seed(seed)  # this runs in a fresh child process: its global RNG is its own
    model = TwoTower(width, depth).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        scripted = torch.jit.script(model)
    x = torch.randn(batch, width, generator=torch.Generator().manual_seed(seed + 1))
    return model, scripted, x


def _wait_done(fut: Any, timeout_s: float = 60.0) -> torch.Tensor:
    """Poll a future from Python (sleeping releases the GIL, which the forked task may need), then take its value."""
    deadline = time.monotonic() + timeout_s
    while not fut.done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"forked task not done after {timeout_s:.0f} s")
        time.sleep(0.0005)
    return fut.value()


def eager_fork_demo(model: TwoTower, x: torch.Tensor) -> dict[str, Any]:
    """Fork in eager mode: the call lasts as long as the work, runs on the caller's thread, returns a done future."""
    seen: list[int] = []

    def probe(inp: torch.Tensor) -> torch.Tensor:
        seen.append(threading.get_ident())
        return model.left(inp)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        t = time.perf_counter()
        fut = torch.jit.fork(probe, x)
        call_s = time.perf_counter() - t
        done = bool(fut.done())
        out = torch.cat([torch.jit.wait(fut), torch.jit.wait(torch.jit.fork(model.right, x))], dim=1)
    t = time.perf_counter()
    model.left(x)
    work_s = time.perf_counter() - t
    return {
        "call_s": call_s,
        "work_s": work_s,
        "done_at_return": done,
        "same_thread": bool(seen and seen[0] == threading.get_ident()),
        "out": out,
    }


def script_launch_demo(scripted: torch.jit.ScriptModule, x: torch.Tensor) -> dict[str, Any]:
    """Fork in TorchScript: the call returns a pending future almost at once; the work runs on the pool."""
    t = time.perf_counter()
    fut = scripted.launch_left(x)
    call_s = time.perf_counter() - t
    done = bool(fut.done())
    out = _wait_done(fut)
    return {"call_s": call_s, "work_s": time.perf_counter() - t, "done_at_return": done, "out": out}


def tower_benches(width: int, depth: int, batch: int, seed: int, warmup: int) -> list[Bench]:
    """Warmed-up benches for the three schedules, plus the eager-vs-script fork demonstrations and value checks."""
    model, scripted, x = build(width, depth, batch, seed)
    benches = []
    with torch.no_grad():
        for _ in range(max(2, warmup)):  # TorchScript's profiling executor optimises after a couple of calls
            script_launch_demo(scripted, x)
        reference = scripted.sequential(x)
        eager = eager_fork_demo(model, x)
        launch = script_launch_demo(scripted, x)
        eager_seq = model.sequential(x)
        flops = 2 * 2.0 * batch * width * width * depth
        for variant in ("sequential", "forked", "fork_one"):
            fn = getattr(scripted, variant)
            for _ in range(max(2, warmup)):
                out = fn(x)
            diff = float((out - reference).abs().max())
            benches.append(Bench("towers", variant, _no_grad(fn, x), flops, {"max_abs_diff": diff}))
    for name, demo, ref in (("eager_fork", eager, eager_seq), ("script_fork", launch, reference[:, :width])):
        extra = {k: v for k, v in demo.items() if k != "out"}
        extra["max_abs_diff"] = float((demo["out"] - ref).abs().max())
        benches.append(Bench("towers", name, None, 0.0, extra))  # a demonstration, not re-timed
    return benches


def _no_grad(fn: Any, x: torch.Tensor) -> Any:
    def call() -> torch.Tensor:
        with torch.no_grad():
            return fn(x)

    return call
