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
