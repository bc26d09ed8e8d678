"""The formulas the chapters' prose states, one function each, computed by the code that runs them.

The chapters quote closed forms (a star's time against a ring's, a staleness-aware step, the expected slowest of N
workers, the bytes that fit on a GPU); `tests/test_formulas.py` reads the numbers the prose states and checks each
against the function here, so that a formula in the text cannot drift from the code again. Each function calls the
package's own implementation where there is one (the cost model, the server's update rule, fit.py), rather than
restating it.
"""

from __future__ import annotations

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


# --- chapters 04 and 10: staleness ---------------------------------------------------------------------------


def staleness(version_read: int, version_applied: int) -> int:
    """tau = v_applied - 1 - v_read: updates other workers applied between a read and the write of its gradient.

    Zhang et al.'s sigma = i - j (computed on W_j, applied to W_i, so j = v_read and i = v_applied - 1) is this count.
    """
    return version_applied - 1 - version_read


def staleness_aware_step(lr: float, tau: int) -> float:
    """The staleness-aware server's step for a gradient tau updates stale: lr / (tau + 1) (ps/optimizers.py's rule)."""
    from ..ps.optimizers import staleness_aware_scale

    return lr * staleness_aware_scale(tau)


def round_robin_staleness(n: int) -> int:
    """Staleness of every gradient once N equal workers land in a fixed order: N - 1 (Zhang et al. measure N,
    because their learners pull before their own previous gradient lands)."""
    return n - 1
