"""Chapter 07 on GPUs: the pipeline schedules over NCCL with CUDA tensors equal one process (skipped without one).

Each rank needs a GPU of its own (NCCL does not share a GPU between ranks): with one GPU the pipeline has one
stage, which still runs the engine's CUDA path; with two, activations and gradients cross GPUs.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dsgd_teach.pipeline import PipelineConfig, reference_training, run_pipeline

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

CONFIG = PipelineConfig(depth=4, hidden=32, steps=3, batch_size=24, microbatches=3, lr=0.2, device="cuda", seed=2)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("schedule", ["naive", "gpipe", "1f1b", "decoupled"])
def test_every_schedule_on_cuda_equals_single_process_training(gpu_client, schedule: str) -> None:
    stages = min(2, torch.cuda.device_count())
    config = CONFIG.replace(stages=stages, schedule=schedule, gradient_delay=1)
    result = run_pipeline(config, gpu_client)
    assert result.summary["backend"] == "nccl"
    params, grads, losses = reference_training(config.replace(device="cpu"))
    np.testing.assert_allclose(result.params, params, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(result.extras.grads, grads, rtol=1e-4, atol=1e-5)
    curve = result.trace[result.trace.event == "update"].sort_values("step").loss.to_numpy()
    np.testing.assert_allclose(curve, losses, rtol=1e-4, atol=1e-5)
