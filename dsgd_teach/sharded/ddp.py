"""Bucketed, overlapped data parallelism: gradient hooks start one asynchronous allreduce per bucket mid-backward.

Each parameter gets a hook that fires once its gradient is accumulated. When every parameter of a bucket has
fired, the bucket's gradients are copied into one flat buffer and its allreduce is launched without waiting:
the library's as an async work handle, the course's ring on a communication thread. Backward goes on with the
earlier layers meanwhile; finish() waits for the buckets and writes the averaged gradients back. Inside
no_sync() the hooks do nothing, so k microbatches accumulate locally and only the last one communicates.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist

from ..collectives.algorithms import ring_allreduce
from ..runtime.comm import Comm
from .buckets import assign_buckets


class OverlappedDDP:
    """Wrap a module's parameters for data parallelism with bucketed allreduces that overlap backward."""

    def __init__(self, module: torch.nn.Module, comm: Comm, bucket_bytes: int = 1 << 20, allreduce: str = "library",
                 overlap: bool = True) -> None:
        self.module, self.comm, self.allreduce, self.overlap = module, comm, allreduce, overlap
        self.params = [p for p in module.parameters() if p.requires_grad]
        sizes = [p.numel() * p.element_size() for p in self.params]
        self.buckets = assign_buckets(sizes, bucket_bytes)
        self.bucket_of = {i: b for b, members in enumerate(self.buckets) for i in members}
        self.sync = True
        # One flat buffer per bucket; each gradient is a view into it, so no copy is needed before or after the
        # allreduce (DDP's gradient_as_bucket_view). A gradient set to None or replaced is copied back in.
        self.flats = [torch.zeros(sum(self.params[i].numel() for i in b), dtype=self.params[b[0]].dtype,
                                  device=self.params[b[0]].device) for b in self.buckets]
        self.views: dict[int, torch.Tensor] = {}
        for b, members in enumerate(self.buckets):
            offset = 0
            for i in members:
                p = self.params[i]
                self.views[i] = self.flats[b][offset:offset + p.numel()].view_as(p)
                offset += p.numel()
                p.grad = self.views[i]
        self.events: list[dict[str, Any]] = []  # one per bucket: launch and done times, bytes
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="dsgd-ddp-ring") if allreduce == "ring" else None
        self._reset()
        for i, p in enumerate(self.params):
            p.register_post_accumulate_grad_hook(lambda p, i=i: self._ready(i))

    def _reset(self) -> None:
        self._waiting = [len(b) for b in self.buckets]
        self._pending: list[tuple[int, Any, torch.Tensor]] = []

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients locally: no communication for the backward passes run inside."""
        old, self.sync = self.sync, False
        try:
            yield
        finally:
            self.sync = old

    def _ready(self, i: int) -> None:
        if not self.sync:
            return
        b = self.bucket_of[i]
        self._waiting[b] -= 1
        if self._waiting[b] == 0 and self.overlap:
            self._launch(b)

    def _launch(self, b: int) -> None:
        """Flatten bucket b's gradients and start its allreduce without waiting for it."""
        flat = self.flats[b]
        for i in self.buckets[b]:
            p, view = self.params[i], self.views[i]
            if p.grad is None or p.grad.data_ptr() != view.data_ptr():  # zero_grad(set_to_none=True) or a replaced gradient: copy it in
                view.copy_(p.grad)
                p.grad = view
        event = {"bucket": b, "launch_s": time.perf_counter(), "bytes": flat.numel() * flat.element_size()}
        self.events.append(event)

        def done(_: Any) -> None:
            event["done_s"] = time.perf_counter()

        if self._pool is not None:
            handle: Any = self._pool.submit(self._ring, flat)
            handle.add_done_callback(done)
        else:
            n = self.comm.world  # the library's messages are invisible: count what a ring would send
            self.comm.log.append({"direction": "send", "bytes": event["bytes"] * 2 * (n - 1) // n,
                                  "elements": flat.numel() * 2 * (n - 1) // n, "phase": "library"})
            handle = dist.all_reduce(flat, async_op=True)
            handle.get_future().then(done)
        self._pending.append((b, handle, flat))

    def _ring(self, flat: torch.Tensor) -> torch.Tensor:
        return ring_allreduce(self.comm, flat)

    def finish(self) -> None:
        """Wait for every bucket's allreduce and replace each gradient by its average over ranks."""
        if not self.overlap:  # the baseline: every bucket after backward, one after another
            for b in range(len(self.buckets)):
                self._launch(b)
                self._wait_last()
        for _, handle, flat in self._pending:
            if isinstance(handle, Future):
                flat.copy_(handle.result(timeout=self.comm.timeout_s))  # the ring returns a new tensor
            else:
                self._wait(handle, flat)  # the library reduced the bucket in place
            flat.div_(self.comm.world)  # the gradients are views: they now hold the average
        self.events = [dict(e, done_s=e.get("done_s", time.perf_counter())) for e in self.events]
        self._reset()

    def _wait_last(self) -> None:
        b, handle, flat = self._pending[-1]
        if isinstance(handle, Future):
            handle.result(timeout=self.comm.timeout_s)
        else:
            self._wait(handle, flat)

    def _wait(self, handle: Any, flat: torch.Tensor) -> torch.Tensor:
        self.comm.wait_all([handle], "a bucket's allreduce")
        return flat

    def take_events(self) -> list[dict[str, Any]]:
        """The bucket events since the last call (launch_s, done_s on time.perf_counter's clock, bytes)."""
        out, self.events = self.events, []
        return out

    def close(self) -> None:
        """Stop the communication thread (ring only)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
