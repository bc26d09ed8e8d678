"""The formulas the chapters' prose states, one function each, computed by the code that runs them.

The chapters quote closed forms (a star's time against a ring's, a staleness-aware step, the expected slowest of N
workers, the bytes that fit on a GPU); `tests/test_formulas.py` reads the numbers the prose states and checks each
against the function here, so that a formula in the text cannot drift from the code again. Each function calls the
package's own implementation where there is one (the cost model, the server's update rule, fit.py), rather than
restating it.
"""

from __future__ import annotations

import math
from fractions import Fraction

from ..collectives.cost_model import AlphaBeta, predict_seconds

# --- chapter 05: star against ring --------------------------------------------------------------------------


def star_over_ring_time(n: int, alpha: float, beta: float, nbytes: float) -> float:
    """Predicted time of the star (gather to rank 0, add, broadcast) over the ring's, from the alpha-beta model.

    The star's 2(N-1) messages of B bytes run one after another through rank 0: 2(N-1)(alpha + beta B); the ring's
    2(N-1) steps move B/N each: 2(N-1)(alpha + beta B/N). The ratio (alpha + beta B)/(alpha + beta B/N) tends to N.
    Computed with the cost model's schedules (collectives/cost_model.py), float32 elements.
    """
    model, k = AlphaBeta(alpha, beta), max(1, round(nbytes / 4))
    return predict_seconds(model, "naive", n, k) / predict_seconds(model, "ring", n, k)


def star_over_ring_load(n: int) -> Fraction:
    """Bytes the star's rank 0 sends, (N-1)K, over what a ring rank sends, 2(N-1)K/N: N/2 (a load, not a time)."""
    return Fraction(n - 1) / Fraction(2 * (n - 1), n)


# --- chapters 04 and 11: staleness ---------------------------------------------------------------------------


def staleness(version_read: int, version_applied: int) -> int:
    """tau = v_applied - 1 - v_read: updates other workers applied between a read and the write of its gradient.

    Zhang et al.'s tau_{i,l} = i - j (2015, section 2.1: computed on the weights of timestamp j, pushed to the server
    at timestamp i, so j = v_read and i = v_applied - 1) is this count.
    """
    return version_applied - 1 - version_read


def staleness_aware_step(lr: float, tau: int) -> float:
    """The staleness-aware server's step for a gradient tau updates stale: lr / (tau + 1) (ps/optimizers.py's rule)."""
    from ..ps.optimizers import staleness_aware_scale

    return lr * staleness_aware_scale(tau)


def round_robin_staleness(n: int) -> int:
    """Staleness of every gradient once N equal workers land in a fixed order: N - 1 (Zhang et al.'s section 2.4
    reports a mean 'close to' 30 for 30 learners, which does not tell 29 from 30)."""
    return n - 1


# --- chapters 04 and 11: the slowest of N, the N-th of N + b ----------------------------------------------------


def harmonic(n: int) -> float:
    """H_n = 1 + 1/2 + ... + 1/n (H_0 = 0)."""
    return sum(1.0 / i for i in range(1, n + 1))


def expected_max_exponential(n: int, mu: float = 1.0) -> float:
    """E[max of N independent exponentials of mean mu] = mu H_N (the barrier's expected wait, chapter 04)."""
    return mu * harmonic(n)


def expected_kth_of_exponential(k: int, m: int, mu: float = 1.0) -> float:
    """E[k-th smallest of M exponentials of mean mu] = mu (H_M - H_{M-k}): 'first N of N + b' is k = N, M = N + b."""
    return mu * (harmonic(m) - harmonic(m - k))


def lognormal_quantile_over_mean(q: float) -> float:
    """q-quantile of chapter 04's log-normal straggler delay over its mean: exp(z_q sigma - sigma^2 / 2).

    The delay is severity * exp(sigma z - sigma^2 / 2) with z standard normal (syncasync/delays.py), so its mean is
    the severity; at q = 0.99, z_q = 2.326 and sigma = 1.5 give about 11 ('a heavy tail', chapters 04 and 11).
    """
    from statistics import NormalDist

    from ..syncasync.delays import LOGNORMAL_SIGMA

    return math.exp(NormalDist().inv_cdf(q) * LOGNORMAL_SIGMA - LOGNORMAL_SIGMA**2 / 2)


# --- chapter 05: bytes of the ring ---------------------------------------------------------------------------


def ring_elements_per_rank(n: int, k: int) -> float:
    """2(N-1)K/N elements each rank of a ring allreduce sends (exact for every rank when N divides K)."""
    from ..collectives.algorithms import elements_sent

    if k % n == 0:
        return float(elements_sent("ring", k, n, 0))
    return 2 * (n - 1) * k / n


# --- chapter 07: the bubble ----------------------------------------------------------------------------------


def bubble_of_step(p: int, m: int) -> float:
    """GPipe's bubble as a fraction of the step, (p-1)/(m+p-1) (Huang et al. 2019, section 2.3): the schedules' own
    ideal_bubble."""
    from ..pipeline.schedules import ideal_bubble

    return ideal_bubble(p, m, "gpipe")


def bubble_over_compute(p: int, m: int) -> float:
    """The same idle time over the ideal compute time, (p-1)/m (Narayanan et al. 2021, section 2.2.1)."""
    step = bubble_of_step(p, m)
    return step / (1 - step)


def bubble_decoupled(p: int, m: int, backward_over_forward: float = 2.0) -> float:
    """Decoupled backprop's bubble, (p-1)/(m+p-1+m t_b/t_f): only the forward fill idles a stage, (p-1) t_f of a
    step of (m+p-1) t_f + m t_b (Huo et al. 2018's unlocked backwards): the schedules' own ideal_bubble."""
    from ..pipeline.schedules import ideal_bubble

    return ideal_bubble(p, m, "decoupled", backward_over_forward)


def gpipe_over_naive_speedup(p: int, m: int) -> float:
    """How much faster GPipe's step is than the naive schedule's on the same work: p m / (m + p - 1), from the two
    schedules' bubbles ((p-1)/(m+p-1) and (p-1)/p); 2m/(m+1) at p = 2."""
    from ..pipeline.schedules import ideal_bubble

    return (1 - ideal_bubble(p, m, "gpipe")) / (1 - ideal_bubble(p, m, "naive"))


# --- chapter 09: memory ---------------------------------------------------------------------------------------


def zero_states_bytes(psi: float, n: int, stage: int) -> float:
    """Bytes of model states per rank under ZeRO `stage`, mixed-precision Adam: 16Ψ, 4Ψ + 12Ψ/N, 2Ψ + 14Ψ/N, 16Ψ/N
    (Rajbhandari et al. 2020, Figure 1): fit.py's model_states."""
    from ..sharded.fit import model_states

    return model_states(psi, n, stage, "mixed")["total"]


def checkpoint_peak_layers(layers: int, segments: int) -> float:
    """Layers' worth of activations at the peak of backward with `segments` checkpoints: L/k kept by the segment
    being rebuilt plus the k checkpoints (Chen et al. 2016, section 4)."""
    return layers / segments + segments
