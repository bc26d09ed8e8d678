"""Chapter 09 on GPUs: overlapped DDP and ZeRO over NCCL with CUDA tensors, and CUDA's own memory figure (skipped without a GPU)."""

from __future__ import annotations

import pytest
import torch

from dsgd_teach.sharded import DDPConfig, ZeroConfig, run_ddp, run_zero

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.timeout(300)
def test_overlapped_ddp_on_nccl_equals_torch_ddp(gpu_client) -> None:
    world = min(2, torch.cuda.device_count())
    for allreduce in ("library", "ring"):
        r = run_ddp(DDPConfig(workers=world, device="cuda", allreduce=allreduce, bucket_mb=0.01, steps=3,
                              compare_torch=True), gpu_client)
        assert r.summary["backend"] == "nccl"
        assert r.summary["max_diff_vs_torch_ddp"] <= 1e-5, (allreduce, r.summary)


@pytest.mark.timeout(300)
def test_zero_on_cuda_equals_adam_and_cuda_memory_covers_the_held_bytes(gpu_client) -> None:
    world = min(2, torch.cuda.device_count())
    for stage in (1, 3):
        r = run_zero(ZeroConfig(workers=world, device="cuda", stage=stage, steps=3, compare="adam"), gpu_client)
        assert r.summary["backend"] == "nccl"
        assert r.summary["max_diff_vs_oracle"] <= 1e-5, (stage, r.summary)
        b = run_zero(ZeroConfig(workers=world, device="cuda", stage=stage, precision="bf16", steps=2, depth=6), gpu_client)
        ups = b.trace[b.trace.event == "update"]
        assert (ups.cuda_max_bytes >= ups.held_total).all(), ups[["cuda_max_bytes", "held_total"]]
        assert abs(b.summary["held_bytes"] / b.summary["formula_bytes"] - 1) <= 0.10, b.summary
