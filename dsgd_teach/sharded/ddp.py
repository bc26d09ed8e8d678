"""Bucketed, overlapped data parallelism: gradient hooks start one asynchronous allreduce per bucket mid-backward.

Each trainable parameter gets a hook that fires once its gradient is accumulated. When every parameter of a bucket
has fired, and every earlier bucket has started (buckets start in the same order on every rank, as in Li et al.
2020, section 3.2.3), the bucket's allreduce is launched without waiting: the library's as an async work handle,
the course's ring on a communication thread (the buffers and their collectives: `ddp_buckets.py`). Backward goes
on with the earlier layers meanwhile; finish() waits for the buckets and leaves the averaged gradients in place.
Inside no_sync() the hooks only note which parameters were used, so k microbatches accumulate locally and only
the last one communicates.

A parameter that gets no gradient (forward did not use it) would leave its bucket waiting forever: an error naming
it, or with find_unused_parameters=True a zero gradient, as in PyTorch's DDP (`ddp_unused.py`). Frozen parameters
(requires_grad=False) are left out; a parameter shared by several layers is one parameter, averaged once.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from ..runtime.ranks.comm import Comm
from .buckets import assign_buckets
from .ddp_buckets import BucketBuffers
from .ddp_unused import ParameterUse


class OverlappedDDP:
    """Wrap a module's parameters for data parallelism with bucketed allreduces that overlap backward."""

    def __init__(self, module: torch.nn.Module, comm: Comm, bucket_bytes: int = 1 << 20, allreduce: str = "library",
                 overlap: bool = True, find_unused_parameters: bool = False) -> None:
        self.module, self.comm, self.overlap = module, comm, overlap
        self.find_unused_parameters = find_unused_parameters
        named = [(name, p) for name, p in module.named_parameters() if p.requires_grad]  # shared ones appear once
        params = [p for _, p in named]
        self.buckets = assign_buckets([p.numel() * p.element_size() for p in params], bucket_bytes)
        self.bucket_of = {i: b for b, members in enumerate(self.buckets) for i in members}
        self.grads = BucketBuffers(params, self.buckets, comm, allreduce)  # each .grad a view of its bucket's buffer
        self.use = ParameterUse([n for n, _ in named], params)
        self.sync = True
        self._reset()
        for i, p in enumerate(params):
            p.register_post_accumulate_grad_hook(lambda p, i=i: self._hook(i))

    def _reset(self) -> None:
        self._waiting = [len(b) for b in self.buckets]  # gradients each bucket still waits for
        self._next = 0  # the next bucket to launch: buckets start in order on every rank
        self.use.reset()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The module's forward; with find_unused_parameters, parameters it did not use count as ready now."""
        out = self.module(*args, **kwargs)
        if self.find_unused_parameters and self.sync and torch.is_grad_enabled():
            for i in self.use.not_reached(out):
                self.use.skip(i)
                self._ready(i)
        return out

    def _hook(self, i: int) -> None:
        """Parameter i's gradient has been accumulated."""
        if self.sync:
            self.use.refuse_skipped_gradient(i)
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
        """Parameter i is ready: launch, in order, every bucket that no longer waits for a gradient."""
        self.use.got_gradient(i)
        if not self.sync:
            return
        self._waiting[self.bucket_of[i]] -= 1
        while self.overlap and self._next < len(self.buckets) and self._waiting[self._next] == 0:
            self._launch(self._next)

    def _launch(self, b: int) -> None:
        """Put bucket b's gradients in its flat buffer and start its allreduce without waiting for it."""
        self._next = b + 1
        self.grads.fill(b, self.use.contributes)
        self.grads.start(b)

    def finish(self) -> None:
        """Wait for every bucket's allreduce and replace each gradient by its average over ranks."""
        if not self.find_unused_parameters:
            try:
                self.use.refuse_missing(self.comm.rank)
            except ValueError:
                self._reset()
                raise
        for i in self.use.missing():  # parameters the graph walk could not see (forward called directly)
            self.use.skip(i)
        while self._next < len(self.buckets):  # the baseline, or buckets holding parameters nobody used here
            self._launch(self._next)
            if not self.overlap:
                self.grads.wait_last()
        ranks_using = self.grads.all_sum(self.use.counts(self.grads.flats[0].device)) \
            if self.find_unused_parameters else None
        self.grads.average()  # the sum of each bucket, divided by N
        if ranks_using is not None:
            self.use.restore_unused_everywhere(ranks_using, self.grads.views)
        self._reset()

    def take_events(self) -> list[dict[str, Any]]:
        """The bucket events since the last call (launch_s, done_s on time.perf_counter's clock, bytes)."""
        return self.grads.take_events()

    def close(self) -> None:
        """Stop the communication thread (ring only)."""
        self.grads.close()
