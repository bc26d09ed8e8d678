"""CUDA streams, the device-side analogue of the inter-op pool: independent kernel chains queued on separate streams.

A GPU runs kernels from one stream in order; kernels on different streams may overlap when each leaves part of
the GPU idle (small matrices). Same chains, same values, either way. On a machine without CUDA this reports a
single "skipped" measurement instead.
"""

from __future__ import annotations

from typing import Any

import torch

from .workloads import Bench


def _chain(a: torch.Tensor, depth: int) -> torch.Tensor:
    x = a
    for _ in range(depth):
        x = torch.tanh(x @ a)
    return x


def stream_benches(size: int, chains: int, depth: int, seed: int, warmup: int) -> list[Bench]:
    """Benches running `chains` independent matmul chains on the default stream vs one stream per chain."""
    if not torch.cuda.is_available():
        return [Bench("streams", "skipped", None, 0.0, {"reason": "no CUDA device in this worker"})]
    device = torch.device("cuda")
    g = torch.Generator(device=device).manual_seed(seed)
    mats = [torch.randn(size, size, device=device, generator=g) / size**0.5 for _ in range(chains)]
    streams = [torch.cuda.Stream(device=device) for _ in range(chains)]

    def on_default() -> list[torch.Tensor]:
        outs = [_chain(a, depth) for a in mats]
        torch.cuda.synchronize(device)
        return outs

    def on_streams() -> list[torch.Tensor]:
        current = torch.cuda.current_stream(device)
        outs = []
        for stream, a in zip(streams, mats, strict=True):
            stream.wait_stream(current)  # inputs were made on the default stream
            with torch.cuda.stream(stream):
                outs.append(_chain(a, depth))
        torch.cuda.synchronize(device)
        return outs

    for _ in range(max(1, warmup)):
        ref, got = on_default(), on_streams()
    diff = max(float((r - o).abs().max()) for r, o in zip(ref, got, strict=True))
    flops = 2.0 * size**3 * depth * chains
    extra: dict[str, Any] = {"max_abs_diff": diff, "device_name": torch.cuda.get_device_name(device)}
    return [
        Bench("streams", "default_stream", on_default, flops, dict(extra)),
        Bench("streams", "streams", on_streams, flops, dict(extra)),
    ]
