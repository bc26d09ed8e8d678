"""Chapter 05 on GPUs: the same hand-written allreduces over NCCL with CUDA tensors (skipped without a GPU)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dsgd_teach.collectives import (
    ALGORITHMS,
    AllreduceConfig,
    elements_sent,
    expected_sum,
    run_allreduce,
    verify_algorithms,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.timeout(300)
def test_nccl_allreduces_equal_the_sum(gpu_client) -> None:
    world = min(2, torch.cuda.device_count())
    sizes = (1, 3, 1001)
    outputs, messages, spec = verify_algorithms(gpu_client, world, tuple(ALGORITHMS), sizes, device="cuda")
    assert spec.backend == "nccl"
    for (algorithm, k), per_rank in outputs.items():
        for out in per_rank:
            np.testing.assert_allclose(out, expected_sum(0, world, k), rtol=1e-5, atol=1e-5, err_msg=algorithm)
    sent = messages[messages.direction == "send"]
    for job, (algorithm, k) in enumerate((a, k) for a in ALGORITHMS for k in sizes):
        if algorithm == "library":
            continue
        mine = sent[sent.job == job]
        for rank in range(world):
            assert int(mine[mine["rank"] == rank].elements.sum()) == elements_sent(algorithm, k, world, rank)


@pytest.mark.timeout(300)
def test_nccl_ring_run(gpu_client) -> None:
    world = min(2, torch.cuda.device_count())
    result = run_allreduce(AllreduceConfig(workers=world, elements=1 << 20, repeats=3, device="cuda"), gpu_client)
    assert result.summary["backend"] == "nccl"
    assert result.summary["max_abs_error"] < 1e-3
