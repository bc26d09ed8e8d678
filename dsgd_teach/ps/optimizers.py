"""Server-side update rules, shared by chapter 03's shards, chapter 04's asynchronous server and the simulator.

* ``sgd``: w <- w - lr g.
* ``adagrad`` (Duchi et al. 2011), as DistBelief ran it per parameter.
* ``staleness_aware`` (Zhang, Gupta, Lian & Liu 2015): the step lr / (tau + 1), see staleness_aware_scale.
* ``adarevision`` (McMahan & Streeter 2014): AdaGrad that also revises the step it gave the gradients which
  landed while this one was being computed.
* ``dcasgd`` (Zheng et al. 2017): delay-compensated ASGD, g + lambda g*g*(w_now - w_read).

A server calls ``read(version, values)`` whenever it hands out parameters and ``apply(values, grad, step,
version_read, version)`` whenever a gradient lands. The delay a rule uses is the one the server observed:
tau = version - version_read updates were applied between the read and this update (version_read=None: no
delay, as in a synchronous step). Rules map to *new* values without mutating the old array, so a server can hand
its current array to a reader without copying it: a later update never changes what was already read.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np

OPTIMIZERS = ("sgd", "adagrad", "staleness_aware", "adarevision", "dcasgd")
#: Zheng et al.'s variance-control parameter lambda in their constant-lambda form.
DEFAULT_DC_LAMBDA = 0.04
#: At most this many read versions are remembered (reads that are never followed by a push are forgotten).
MAX_READS = 4096


class ReadLog:
    """What readers saw, by version, kept until as many pushes from that version as reads of it have landed."""

    def __init__(self, limit: int = MAX_READS) -> None:
        self.entries: OrderedDict[int, list[Any]] = OrderedDict()
        self.limit, self.misses = limit, 0

    def add(self, version: int, item: Any) -> None:
        """One more reader of `version`, which saw `item`."""
        entry = self.entries.get(version)
        if entry is not None:
            entry[0] += 1
            return
        self.entries[version] = [1, item]
        if len(self.entries) > self.limit:
            self.entries.popitem(last=False)

    def take(self, version: int) -> Any:
        """What the reader of `version` saw (None, counted as a miss, if it was forgotten, e.g. after a restore)."""
        entry = self.entries.get(version)
        if entry is None:
            self.misses += 1
            return None
        entry[0] -= 1
        if entry[0] <= 0:
            del self.entries[version]
        return entry[1]


def staleness(version_read: int | None, version: int | None) -> int:
    """Updates the server applied between the read and this update (0 when there was no read to speak of)."""
    if version_read is None or version is None:
        return 0
    return max(0, int(version) - int(version_read))


def staleness_aware_scale(tau: int) -> float:
    """The staleness-aware rule's factor on the learning rate for a gradient tau updates stale: 1 / (tau + 1).

    Zhang, Gupta, Lian & Liu (2015, arXiv:1511.05950; IJCAI 2016) define, in their section 2.1, the staleness of
    learner l's gradient computed on the weights of timestamp j (the updates applied before they were read) and
    pushed to the server at timestamp i as tau_{i,l} = i - j: the same count as our tau (j = v_read, i = v_applied - 1), 0 for a
    fresh gradient. Their section 2.4 sets each gradient's learning rate to alpha_0 / tau_{i,l} and measures (Figure
    1, 30 learners) a mean staleness close to n under n-softsync, about N when the server updates on every gradient.
    As printed the rule divides by zero at tau = 0, which the paper's text does not address. The course's rule is
    its own choice, lr / (tau + 1) = lr / (v_applied - v_read): a gradient that missed nothing keeps lr, and at the
    mean staleness of N equal workers, about N - 1, the step is about lr / N, as theirs is at their mean of about
    N. (Guarding their rule with max(1, tau) would leave every step with tau <= 1 unchanged: at N = 2, nearly all.)
    """
    return 1.0 / (max(0, int(tau)) + 1)


class ServerSGD:
    """w <- w - lr * g."""

    name = "sgd"
    uses_reads = False

    def read(self, version: int, values: np.ndarray) -> None:
        """A reader got `values` at `version` (SGD needs to remember nothing)."""

    def scale(self, version_read: int | None, version: int | None) -> float:
        """The factor this rule puts on lr for a gradient of this delay (recorded as lr_scale in traces)."""
        return 1.0

    def apply(
        self, values: np.ndarray, grad: np.ndarray, step: float, version_read: int | None = None,
        version: int | None = None,
    ) -> np.ndarray:
        """New values after one step of size `step` (lr times the push's scale), with a single allocation.

        (-step * g) + w equals w - step * g bit for bit: negation is exact in floating point.
        """
        new = np.multiply(grad, np.float32(-step * self.scale(version_read, version)), dtype=np.float32)
        new += values
        return new

    def state(self) -> dict[str, np.ndarray]:
        """Arrays a checkpoint must keep (none for SGD)."""
        return {}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        """Restore from a checkpoint's arrays."""


class ServerStalenessAware(ServerSGD):
    """Zhang, Gupta, Lian & Liu (2015): a gradient tau updates stale gets the step lr / (tau + 1)."""

    name = "staleness_aware"

    def scale(self, version_read: int | None, version: int | None) -> float:
        return staleness_aware_scale(staleness(version_read, version))


class ServerDCASGD(ServerSGD):
    """Zheng et al. (2017): w <- w - lr (g + lambda g*g*(w_now - w_read)), a first-order Taylor correction of
    the stale gradient towards the gradient at w_now, with g*g standing in for the Hessian's diagonal."""

    name = "dcasgd"
    uses_reads = True

    def __init__(self, dc_lambda: float = DEFAULT_DC_LAMBDA, max_reads: int = MAX_READS) -> None:
        self.dc_lambda = np.float32(dc_lambda)
        self.reads = ReadLog(max_reads)

    def read(self, version: int, values: np.ndarray) -> None:
        """Remember the parameters the reader got (a reference: the server never mutates them)."""
        self.reads.add(version, values)

    def apply(
        self, values: np.ndarray, grad: np.ndarray, step: float, version_read: int | None = None,
        version: int | None = None,
    ) -> np.ndarray:
        w_read = self.reads.take(version_read) if version_read is not None else None
        drift = values - (values if w_read is None else w_read)
        compensated = grad + self.dc_lambda * grad * grad * drift
        return super().apply(values, compensated, step)


class ServerAdagrad(ServerSGD):
    """Adagrad (Duchi et al. 2011, section 1.1, eq. 1; Figure 1): per-coordinate step lr / (sqrt(G) + eps).

    G sums the squared gradients, this one included, from `initial_accumulator`; eps sits where Duchi et al. add
    their delta, outside the root (eq. 5). Coordinates that receive many large gradients slow down and rare ones
    keep a large step, which is why DistBelief found it stabilised Downpour: a burst of stale gradients on one
    coordinate damps itself.
    """

    name = "adagrad"
    uses_reads = False

    def __init__(self, size: int, initial_accumulator: float = 0.1, eps: float = 1e-10) -> None:
        self.accum = np.full(size, initial_accumulator, dtype=np.float32)
        self.eps = np.float32(eps)

    def apply(
        self, values: np.ndarray, grad: np.ndarray, step: float, version_read: int | None = None,
        version: int | None = None,
    ) -> np.ndarray:
        """New values after one Adagrad step; the accumulator is updated in place (it is never shared)."""
        self.accum += grad * grad
        return values - np.float32(step) * grad / (np.sqrt(self.accum) + self.eps)

    def state(self) -> dict[str, np.ndarray]:
        """The accumulator (a checkpoint without it would restart every step size)."""
        return {"accum": self.accum.copy()}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        """Restore the accumulator."""
        self.accum = np.asarray(state["accum"], dtype=np.float32).copy()


class ServerAdaRevision(ServerAdagrad):
    """AdaRevision (McMahan & Streeter 2014), per coordinate. The server keeps z, the sum of every gradient
    applied, and hands a reader z along with w. When that reader's gradient g lands:

        g_bck  = z - z_read                      (what landed while g was computed: the observed delay)
        eta_old = lr / sqrt(G_max)               (the rate in force until now)
        G     += g*g + 2 g*g_bck ;  G_max = max(G_max, G) ;  eta = lr / sqrt(G_max)
        w     <- w - eta g + (eta_old - eta) g_bck

    G is AdaGrad's sum of squares plus the cross terms a delay hides; the last term revises the rate the
    gradients in g_bck were given. With no delay g_bck = 0 and this is AdaGrad exactly.
    """

    name = "adarevision"
    uses_reads = True

    def __init__(
        self, size: int, initial_accumulator: float = 0.1, eps: float = 1e-10, max_reads: int = MAX_READS
    ) -> None:
        super().__init__(size, initial_accumulator, eps)
        self.z = np.zeros(size, dtype=np.float32)  # replaced, never mutated: readers keep a reference
        self.accum_max = self.accum.copy()
        self.reads = ReadLog(max_reads)

    def read(self, version: int, values: np.ndarray) -> None:
        """Remember the gradient sum z at this read."""
        self.reads.add(version, self.z)

    def apply(
        self, values: np.ndarray, grad: np.ndarray, step: float, version_read: int | None = None,
        version: int | None = None,
    ) -> np.ndarray:
        z_read = self.reads.take(version_read) if version_read is not None else None
        lr = np.float32(step)
        eta_old = lr / (np.sqrt(self.accum_max) + self.eps)
        if z_read is None:
            self.accum += grad * grad
        else:
            g_bck = self.z - z_read
            self.accum += grad * grad + np.float32(2) * grad * g_bck
        self.z = self.z + grad
        np.maximum(self.accum_max, self.accum, out=self.accum_max)
        new = values - lr * grad / (np.sqrt(self.accum_max) + self.eps)
        if z_read is not None:
            new += (eta_old - lr / (np.sqrt(self.accum_max) + self.eps)) * g_bck
        return new

    def state(self) -> dict[str, np.ndarray]:
        """z, G and G_max (what readers saw is not kept: a restored shard treats older reads as undelayed)."""
        return {"accum": self.accum.copy(), "accum_max": self.accum_max.copy(), "z": self.z.copy()}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        """Restore z, G and G_max."""
        super().load_state(state)
        self.accum_max = np.asarray(state.get("accum_max", self.accum), dtype=np.float32).copy()
        self.z = np.asarray(state.get("z", np.zeros_like(self.accum)), dtype=np.float32).copy()


Rule = ServerSGD | ServerAdagrad


def make_optimizer(name: str, size: int, dc_lambda: float = DEFAULT_DC_LAMBDA, max_reads: int = MAX_READS) -> Rule:
    """The update rule called name for a server (or shard) of `size` coordinates; max_reads bounds the reads
    remembered (a server with more readers in flight than that must raise it)."""
    if name == "sgd":
        return ServerSGD()
    if name == "staleness_aware":
        return ServerStalenessAware()
    if name == "dcasgd":
        return ServerDCASGD(dc_lambda, max_reads)
    if name == "adagrad":
        return ServerAdagrad(size)
    if name == "adarevision":
        return ServerAdaRevision(size, max_reads=max_reads)
    raise ValueError(f"optimizer must be one of {', '.join(map(repr, OPTIMIZERS))}; got {name!r}")
