"""The transformer chapter on GPUs: tensor (and sequence) parallel training over NCCL with CUDA tensors gives the
single-process oracle's losses (skipped without a GPU)."""

from __future__ import annotations

import pytest
import torch

from dsgd_teach.transformer.tensor_parallel import TPConfig
from dsgd_teach.transformer.tp_run import run_tp

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_tensor_parallel_on_cuda_equals_the_oracle(gpu_client, sequence_parallel: bool) -> None:
    ranks = min(2, torch.cuda.device_count())
    r = run_tp(TPConfig(tp=ranks, device="cuda", sequence_parallel=sequence_parallel, steps=3), gpu_client)
    assert r.summary["backend"] == "nccl"
    assert r.summary["max_loss_error"] <= 1e-4, r.summary


@pytest.mark.timeout(300)
def test_a_composed_layout_on_cuda_equals_the_oracle(gpu_client) -> None:
    """The mesh's training loop with CUDA tensors over NCCL: tensor + sequence parallelism where two GPUs are, the
    one-rank layout (the same loop, nothing to send) on one; the CPU oracle's losses and parameters."""
    from dsgd_teach.transformer.composed import ComposedConfig, run_composed
    from dsgd_teach.transformer.oracle import compare_with_oracle

    layout = {"tp": 2, "sequence_parallel": True} if torch.cuda.device_count() >= 2 else {}
    config = ComposedConfig(device="cuda", steps=3, **layout)
    result = run_composed(config, gpu_client)
    assert result.summary["backend"] == "nccl" and not result.stopped
    gap = compare_with_oracle(result, config)
    assert gap["steps"] == 3 and gap["loss"] <= 1e-4 and gap["params"] <= 1e-4, gap
