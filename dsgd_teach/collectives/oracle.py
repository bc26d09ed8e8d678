"""The oracle: every hand-written allreduce, on every kind of tensor a training loop hands it, against the library's.

Each rank builds the same classes of input (a 0-d scalar, vectors, a Linear layer's 2-D gradient, a transposed
view, a strided slice, empty tensors, fewer elements than ranks) in every dtype gloo sums, from a generator seeded
by (seed, rank). In one process group it runs torch.distributed.all_reduce and each hand-written algorithm on them;
the driver then compares: same shape and dtype, integers exactly equal, floats within a tolerance for the dtype.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from typing import Any

import pandas as pd
import torch
import torch.distributed as dist
from distributed import Client

from ..runtime.ranks.comm import Comm
from ..runtime.ranks.group import plan_group, run_in_group
from ..runtime.ranks.live import WorkerContext
from ..trace import TraceRecorder
from .algorithms import ALGORITHMS, HAND_WRITTEN

#: The dtypes the oracle feeds in: gloo sums each of them (tensors.REDUCIBLE_DTYPES).
ORACLE_DTYPES: tuple[torch.dtype, ...] = (
    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int32, torch.int64,
    torch.int8, torch.uint8, torch.bool, torch.complex64,
)
#: dtypes gloo refuses ("Invalid scalar type"): every algorithm must raise ValueError before sending a byte.
REFUSED_DTYPES: tuple[torch.dtype, ...] = (torch.int16, torch.uint16, torch.uint32)
#: (rtol, atol) per floating dtype: a few units in the last place of sums of N(0, 1) numbers over <= 4 ranks.
TOLERANCE: dict[torch.dtype, tuple[float, float]] = {
    torch.float16: (1e-2, 1e-2), torch.bfloat16: (5e-2, 5e-2), torch.float32: (1e-5, 1e-5),
    torch.float64: (1e-12, 1e-12), torch.complex64: (1e-5, 1e-5),
}


def _draw(gen: torch.Generator, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Random values of `dtype`: normal floats, small integers (sums stay in range), random booleans."""
    if dtype.is_floating_point or dtype.is_complex:
        return torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) < 0.5
    low = 0 if dtype == torch.uint8 else -30
    return torch.randint(low, 30, shape, generator=gen).to(dtype)


def input_cases(seed: int, rank: int, world: int) -> dict[tuple[str, str], torch.Tensor]:
    """(input class, dtype name) -> this rank's tensor; the same classes on every rank."""
    gen = torch.Generator().manual_seed(seed * 1_000 + rank)
    out: dict[tuple[str, str], torch.Tensor] = {}
    for dtype in ORACLE_DTYPES:
        name = str(dtype).removeprefix("torch.")
        out[("scalar 0-d", name)] = _draw(gen, (), dtype)
        out[("vector 7", name)] = _draw(gen, (7,), dtype)
        out[("weight 4x3", name)] = _draw(gen, (4, 3), dtype)
        out[("transposed 3x4", name)] = _draw(gen, (4, 3), dtype).t()
        out[("strided slice", name)] = _draw(gen, (11,), dtype)[::2]
        out[("empty 0", name)] = _draw(gen, (0,), dtype)
        out[("empty 0x3", name)] = _draw(gen, (0, 3), dtype)
        out[("fewer than ranks", name)] = _draw(gen, (max(1, world - 1),), dtype)
    return out


def digest(t: torch.Tensor) -> str:
    """A fingerprint of a tensor's bytes, to check that every rank holds the very same result."""
    raw = t.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes()
    return hashlib.sha1(raw).hexdigest()


def oracle_rank(ctx: WorkerContext, comm: Comm, algorithms: Sequence[str], seed: int) -> list[dict[str, Any]]:
    """Worker side: compare each algorithm's result with the library's on every case; try the refused dtypes."""
    rows: list[dict[str, Any]] = []
    for (case, dtype), x in input_cases(seed, comm.rank, comm.world).items():
        before = x.clone()
        want = ALGORITHMS["library"](comm, x)
        for name in algorithms:
            got = ALGORITHMS[name](comm, x)
            ok, diff, why = compare(got, want)
            rows.append({"algorithm": name, "case": case, "dtype": dtype, "ok": ok, "max_diff": diff,
                         "problem": why, "digest": digest(got), "input_untouched": bool(torch.equal(x, before))})
    for refused in REFUSED_DTYPES:
        for name in ("library", *algorithms):
            comm.take_log()
            dtype = str(refused).removeprefix("torch.")
            try:
                ALGORITHMS[name](comm, torch.ones(3, dtype=refused))
                how, ok = "accepted", False
            except ValueError as exc:
                sent = len(comm.take_log())
                how, ok = f"ValueError after {sent} messages: {exc}", sent == 0 and dtype in str(exc)
            rows.append({"algorithm": name, "case": "refused dtype", "dtype": dtype, "ok": ok, "max_diff": math.nan,
                         "problem": "" if ok else how, "digest": "", "input_untouched": True})
    comm.wait_all([dist.barrier(async_op=True)], "the closing barrier")
    return rows


def compare(got: torch.Tensor, want: torch.Tensor) -> tuple[bool, float, str]:
    """(ok, largest difference, what is wrong) for one result against the library's."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return False, float("nan"), f"got {tuple(got.shape)} {got.dtype}, want {tuple(want.shape)} {want.dtype}"
    if want.numel() == 0:
        return True, 0.0, ""
    if want.dtype in TOLERANCE:
        rtol, atol = TOLERANCE[want.dtype]
        wide = torch.complex128 if want.is_complex() else torch.float64
        diff = float((got.to(wide) - want.to(wide)).abs().max())
        ok = torch.allclose(got.to(wide), want.to(wide), rtol=rtol, atol=atol)
        return ok, diff, "" if ok else f"differs by up to {diff:g}"
    ok = torch.equal(got, want)
    diff = float((got.to(torch.float64) - want.to(torch.float64)).abs().max())
    return ok, diff, "" if ok else f"not exactly equal (up to {diff:g})"


def run_oracle(client: Client, world: int, algorithms: Sequence[str] = HAND_WRITTEN, *, seed: int = 0,
               timeout_s: float = 20.0, run_timeout_s: float = 120.0) -> pd.DataFrame:
    """One gloo group of `world` ranks; a row per (algorithm, input class, dtype, rank) saying if it matched."""
    spec = plan_group(client, world, "cpu", timeout_s)
    per_rank, _ = run_in_group(client, spec, oracle_rank, [(tuple(algorithms), seed)] * world, TraceRecorder(),
                               run_timeout_s)
    table = pd.DataFrame([{"world": world, "rank": rank, **row} for rank, rows in enumerate(per_rank) for row in rows])
    key = ["algorithm", "case", "dtype"]
    same = table.groupby(key).digest.transform("nunique") == 1  # every rank holds bit-identical results
    table["problem"] = table.problem.where(same, "ranks disagree").where(table.input_untouched, "input modified")
    table["ok"] = table.ok & same & table.input_untouched
    return table.drop(columns="digest")
