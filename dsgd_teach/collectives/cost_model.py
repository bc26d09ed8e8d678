"""The alpha-beta cost model: a message of m bytes takes alpha + beta * m seconds (latency plus inverse bandwidth).

alpha and beta are fitted from a ping-pong between two ranks; the model then predicts each allreduce from its
schedule (how many communication steps, how many bytes per step), which the plots set against measurements.
With B = itemsize * K bytes and N ranks, the steps add up to (Thakur, Rabenseifner & Gropp 2005;
Patarasuk & Yuan 2009 for the ring):
* naive star      2(N-1) (alpha + beta B)
* doubling        log2 N (alpha + beta B)                    (butterfly; +2 fold steps if N is no power of two)
* binomial tree   2 ceil(log2 N) (alpha + beta B)            (reduce to rank 0, then broadcast)
* halving-doubl.  2 log2 N alpha + 2 (N-1)/N B beta          (+2 fold steps of alpha + beta B otherwise)
* ring            2(N-1) (alpha + beta B/N)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .algorithms import resolve, schedule
from .layout import chunk_sizes, doubling_layout


@dataclass(frozen=True)
class AlphaBeta:
    """Fitted link model: alpha seconds per message, beta seconds per byte."""

    alpha: float
    beta: float

    @property
    def bandwidth(self) -> float:
        """Bytes per second of the fitted link (1 / beta)."""
        return 1.0 / self.beta if self.beta > 0 else math.inf

    def message(self, nbytes: float) -> float:
        """Predicted seconds for one message of nbytes."""
        return self.alpha + self.beta * nbytes


def fit_alpha_beta(nbytes: np.ndarray, seconds: np.ndarray) -> AlphaBeta:
    """Fit seconds ~ alpha + beta * bytes minimising *relative* errors, so tiny and huge messages both count.

    A plain least-squares line would be dominated by the largest messages and leave alpha to noise; dividing
    each equation by its measured time weighs every size alike. alpha and beta are clipped at zero.
    """
    x = np.asarray(nbytes, dtype=np.float64)
    y = np.asarray(seconds, dtype=np.float64)
    if len(x) < 2 or np.ptp(x) == 0:
        raise ValueError("need timings for at least two different message sizes to fit alpha and beta")
    if np.any(y <= 0):
        raise ValueError("timings must be positive")
    design = np.stack([1.0 / y, x / y], axis=1)
    (alpha, beta), *_ = np.linalg.lstsq(design, np.ones_like(y), rcond=None)
    if alpha < 0:  # latency too small to see: fit beta alone
        alpha, beta = 0.0, float(np.sum(x / y) / np.sum((x / y) ** 2))
    if beta < 0:  # bandwidth too large to see: latency alone
        alpha, beta = float(np.sum(1 / y) / np.sum((1 / y) ** 2)), 0.0
    return AlphaBeta(float(alpha), float(beta))


def schedule_steps(algorithm: str, n: int, k: int, itemsize: int = 4) -> list[float]:
    """Bytes of the largest message in each sequential step of one allreduce (what the slowest link carries)."""
    if n <= 1 or k == 0:
        return []
    nbytes, name = k * itemsize, resolve(algorithm)
    if name == "ring":
        return [max(chunk_sizes(k, n)) * itemsize] * (2 * (n - 1))
    if name == "naive":
        return [nbytes] * (2 * (n - 1))
    if name == "doubling":
        p, extra = doubling_layout(n)
        return [nbytes] * ((p.bit_length() - 1) + (2 if extra else 0))
    if name in ("binomial", "halving-doubling"):
        largest: dict[int, int] = {}
        for m in schedule(name, k, n):
            largest[int(m["step"])] = max(largest.get(int(m["step"]), 0), int(m["elements"]))
        return [largest[s] * itemsize for s in sorted(largest)]
    raise ValueError(f"no schedule for {algorithm!r}")


def predict_seconds(model: AlphaBeta, algorithm: str, n: int, k: int, itemsize: int = 4) -> float:
    """alpha-beta prediction for one allreduce: the sum over steps of alpha + beta * bytes."""
    return sum(model.message(b) for b in schedule_steps(algorithm, n, k, itemsize))


def bus_bandwidth(nbytes: float, n: int, seconds: float) -> float:
    """nccl-tests' bus bandwidth: (bytes / time) * 2(n-1)/n, comparable across n (the ring's link load)."""
    if seconds <= 0 or n <= 1:
        return math.nan
    return nbytes / seconds * 2 * (n - 1) / n
