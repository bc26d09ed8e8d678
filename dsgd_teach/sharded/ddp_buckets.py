"""DDP's gradient buckets as flat buffers, and their allreduces in flight: start one, wait for all, time each.

Each bucket is one flat buffer; each gradient is a view into it, so nothing is copied before or after the
allreduce (PyTorch DDP's gradient_as_bucket_view). The course's ring runs on a communication thread; the
library's allreduce is an asynchronous work handle. `OverlappedDDP` (ddp.py) decides when a bucket starts.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch
import torch.distributed as dist

from ..collectives.algorithms import ring_allreduce
from ..runtime.ranks.comm import Comm


class BucketBuffers:
    """One flat gradient buffer per bucket, each parameter's .grad a view of it, and the allreduces started on them."""

    def __init__(self, params: list[torch.Tensor], buckets: list[list[int]], comm: Comm, allreduce: str) -> None:
        self.params, self.buckets, self.comm = params, buckets, comm
        self.flats = [torch.zeros(sum(params[i].numel() for i in b), dtype=params[b[0]].dtype,
                                  device=params[b[0]].device) for b in buckets]
        self.views: dict[int, torch.Tensor] = {}
        for b, members in enumerate(buckets):
            offset = 0
            for i in members:
                self.views[i] = self.flats[b][offset:offset + params[i].numel()].view_as(params[i])
                offset += params[i].numel()
                params[i].grad = self.views[i]
        self.events: list[dict[str, Any]] = []  # one per started bucket: launch and done times, bytes
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="dsgd-ddp-ring") if allreduce == "ring" else None
        self._pending: list[tuple[Any, torch.Tensor]] = []

    def fill(self, b: int, contributes: Callable[[int], bool]) -> None:
        """Put bucket b's gradients in its buffer: zeros for a parameter that adds nothing, a replaced one copied in."""
        for i in self.buckets[b]:
            p, view = self.params[i], self.views[i]
            if not contributes(i):
                view.zero_()
            elif p.grad is None or p.grad.data_ptr() != view.data_ptr():  # set to None or replaced: copy it in
                view.copy_(p.grad)
            p.grad = view

    def start(self, b: int) -> None:
        """Start summing bucket b's buffer over ranks without waiting for it."""
        flat = self.flats[b]
        event = {"bucket": b, "launch_s": time.perf_counter(), "bytes": flat.numel() * flat.element_size()}
        self.events.append(event)

        def done(_: Any) -> None:
            event["done_s"] = time.perf_counter()

        if self._pool is not None:
            handle: Any = self._pool.submit(ring_allreduce, self.comm, flat)
            handle.add_done_callback(done)
        else:
            n = self.comm.world  # the library's messages are invisible: count what a ring would send
            self.comm.log.append({"direction": "send", "bytes": event["bytes"] * 2 * (n - 1) // n,
                                  "elements": flat.numel() * 2 * (n - 1) // n, "phase": "library"})
            handle = dist.all_reduce(flat, async_op=True)
            handle.get_future().then(done)
        self._pending.append((handle, flat))

    def wait_last(self) -> None:
        """Wait for the bucket started last (the baseline that does not overlap)."""
        self._wait(*self._pending[-1])

    def average(self) -> None:
        """Wait for every started bucket and divide its sum by N: the gradients (views) now hold the average."""
        for handle, flat in self._pending:
            self._wait(handle, flat)
            flat.div_(self.comm.world)
        self._pending = []
        self.events = [dict(e, done_s=e.get("done_s", time.perf_counter())) for e in self.events]

    def _wait(self, handle: Any, flat: torch.Tensor) -> None:
        if isinstance(handle, Future):
            flat.copy_(handle.result(timeout=self.comm.timeout_s))  # the ring returns a new tensor
        else:
            self.comm.wait_all([handle], "a bucket's allreduce")  # the library reduced the bucket in place

    def all_sum(self, values: torch.Tensor) -> torch.Tensor:
        """values summed over ranks, by the same route as the buckets (a small allreduce)."""
        if self._pool is not None:
            return self._pool.submit(ring_allreduce, self.comm, values).result(timeout=self.comm.timeout_s)
        self.comm.wait_all([dist.all_reduce(values, async_op=True)], "the parameters-used count")
        return values

    def take_events(self) -> list[dict[str, Any]]:
        """The bucket events since the last call (launch_s, done_s on time.perf_counter's clock, bytes)."""
        out, self.events = self.events, []
        return out

    def close(self) -> None:
        """Stop the communication thread (ring only)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
