"""Bucketed, overlapped data parallelism: gradient hooks start one asynchronous allreduce per bucket mid-backward.

Each trainable parameter gets a hook that fires once its gradient is accumulated. When every parameter of a bucket
has fired, and every earlier bucket has started (buckets start in the same order on every rank, as in Li et al.
2020, section 3.2.3), the bucket's allreduce is launched without waiting: the library's as an async work handle,
the course's ring on a communication thread. Backward goes on with the earlier layers meanwhile; finish() waits
for the buckets and leaves the averaged gradients in place. Inside no_sync() the hooks only note which parameters
were used, so k microbatches accumulate locally and only the last one communicates.

A parameter that gets no gradient (forward did not use it) would leave its bucket waiting forever. As in
PyTorch's DDP, that is an error naming the parameter unless find_unused_parameters=True: then each forward walks
the autograd graph from the output, the parameters it cannot reach count as ready with a zero gradient, and a
parameter no rank used keeps the gradient it had. Frozen parameters (requires_grad=False) are left out; a
parameter shared by several layers is one parameter, averaged once.
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
from ..runtime.ranks.comm import Comm
from .buckets import assign_buckets
from .zero_units import output_tensors


def reached_parameters(output: Any) -> set[int]:
    """ids of the leaf tensors (parameters) the autograd graph of output reaches."""
    roots = [t.grad_fn for t in output_tensors(output) if t.grad_fn is not None]
    seen, reached = set(), set()
    while roots:
        node = roots.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        variable = getattr(node, "variable", None)  # an AccumulateGrad node: the leaf it accumulates into
        if variable is not None:
            reached.add(id(variable))
        roots.extend(n for n, _ in node.next_functions)
    return reached


class OverlappedDDP:
    """Wrap a module's parameters for data parallelism with bucketed allreduces that overlap backward."""

    def __init__(self, module: torch.nn.Module, comm: Comm, bucket_bytes: int = 1 << 20, allreduce: str = "library",
                 overlap: bool = True, find_unused_parameters: bool = False) -> None:
        self.module, self.comm, self.allreduce, self.overlap = module, comm, allreduce, overlap
        self.find_unused_parameters = find_unused_parameters
        named = [(name, p) for name, p in module.named_parameters() if p.requires_grad]  # shared ones appear once
        self.names, self.params = [n for n, _ in named], [p for _, p in named]
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
            p.register_post_accumulate_grad_hook(lambda p, i=i: self._hook(i))

    def _reset(self) -> None:
        self._waiting = [len(b) for b in self.buckets]
        self._next = 0  # the next bucket to launch: buckets start in order on every rank
        self._pending: list[tuple[int, Any, torch.Tensor]] = []
        self._used = [False] * len(self.params)  # got a gradient since the last finish()
        self._unused: dict[int, torch.Tensor | None] = {}  # skipped by a forward: the gradient it had before

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The module's forward; with find_unused_parameters, parameters it did not use count as ready now."""
        out = self.module(*args, **kwargs)
        if self.find_unused_parameters and self.sync and torch.is_grad_enabled():
            reached = reached_parameters(out)
            for i, p in enumerate(self.params):
                if id(p) not in reached and not self._used[i] and i not in self._unused:
                    self._unused[i] = None if p.grad is None else p.grad.detach().clone()
                    self._ready(i)
        return out

    def _hook(self, i: int) -> None:
        """A gradient arrived: a parameter the forward found unused must not get one (its bucket may have left)."""
        if i in self._unused and self.sync:
            raise RuntimeError(f"OverlappedDDP: {self.names[i]} was found unused after forward but then got a gradient; "
                               "with find_unused_parameters=True run one forward per backward, and compute the loss "
                               "from the forward's output")
        self._ready(i)

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients locally: no communication for the backward passes run inside."""
        old, self.sync = self.sync, False
        try:
            yield
        finally:
            self.sync = old

    def _ready(self, i: int) -> None:
        if i not in self._unused:
            self._used[i] = True
        if not self.sync:
            return
        self._waiting[self.bucket_of[i]] -= 1
        while self.overlap and self._next < len(self.buckets) and self._waiting[self._next] == 0:
            self._launch(self._next)

    def _launch(self, b: int) -> None:
        """Flatten bucket b's gradients and start its allreduce without waiting for it."""
        self._next = b + 1
        flat = self.flats[b]
        for i in self.buckets[b]:
            p, view = self.params[i], self.views[i]
            if i in self._unused or (p.grad is None and not self._used[i]):
                view.zero_()  # this rank adds nothing for a parameter it did not use
                p.grad = view
            elif p.grad is None or p.grad.data_ptr() != view.data_ptr():  # set to None or replaced: copy it in
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

    def _missing(self) -> list[str]:
        """Names of the parameters that got no gradient since the last finish() and were not found unused."""
        return [self.names[i] for i in range(len(self.params)) if not self._used[i] and i not in self._unused]

    def finish(self) -> None:
        """Wait for every bucket's allreduce and replace each gradient by its average over ranks."""
        missing = self._missing()
        if missing and not self.find_unused_parameters:
            shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
            self._reset()
            raise ValueError(
                f"OverlappedDDP: parameter(s) {shown} got no gradient on rank {self.comm.rank} (not used to compute "
                "the loss), so their buckets would never be averaged; pass find_unused_parameters=True, or freeze "
                "them with requires_grad_(False)")
        for i in range(len(self.params)):  # parameters the graph walk could not see (forward called directly)
            if not self._used[i] and i not in self._unused:
                self._unused[i] = None if self.params[i].grad is None else self.params[i].grad.detach().clone()
        while self._next < len(self.buckets):  # the baseline, or buckets holding parameters nobody used here
            self._launch(self._next)
            if not self.overlap:
                self._wait_last()
        used = self._global_use() if self.find_unused_parameters else None
        for _, handle, flat in self._pending:
            if isinstance(handle, Future):
                flat.copy_(handle.result(timeout=self.comm.timeout_s))  # the ring returns a new tensor
            else:
                self._wait(handle, flat)  # the library reduced the bucket in place
            flat.div_(self.comm.world)  # the gradients are views: they now hold the average
        if used is not None:
            for i, before in self._unused.items():
                if used[i] == 0:  # no rank used it: it keeps the gradient it had, as in PyTorch's DDP
                    if before is None:
                        self.params[i].grad = None
                    else:
                        self.views[i].copy_(before)
        self.events = [dict(e, done_s=e.get("done_s", time.perf_counter())) for e in self.events]
        self._reset()

    def _global_use(self) -> torch.Tensor:
        """How many ranks used each parameter in this step (one small allreduce, after the buckets')."""
        flags = torch.tensor([float(u) for u in self._used], device=self.flats[0].device)
        if self._pool is not None:
            return self._pool.submit(ring_allreduce, self.comm, flags).result(timeout=self.comm.timeout_s)
        self.comm.wait_all([dist.all_reduce(flags, async_op=True)], "the parameters-used count")
        return flags

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
