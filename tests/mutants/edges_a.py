"""Boundary mutants for ps01-ps04 (issue 45): one wrong solution per applicable boundary class and question, each
caught by a fixed hidden case at every seed. `COVERAGE` names, per question and class, the mutant (new here or
already in the catalog) or why the class does not apply."""

from __future__ import annotations

from .harness import W

_BACKUP = """
def backup_aggregate(arrivals, n_needed):
    if len(arrivals) < n_needed:
        raise ValueError("too few")
    order = sorted(arrivals, key=lambda a: (a[1], a[0]))
    used, dropped = order[:n_needed], order[n_needed:]
    mean = np.mean([np.asarray(a[2], dtype=float) for a in used], axis=0)
    return {ret}
"""

PS04 = [
    W("[order] dropped workers listed in arrival order", "q1",
      _BACKUP.format(ret="mean, sorted(a[0] for a in used), [a[0] for a in dropped]")),
    W("[order] used workers listed in arrival order", "q1",
      _BACKUP.format(ret="mean, [a[0] for a in used], sorted(a[0] for a in dropped)")),
    W("[dtype] mean accumulated in np.zeros_like(first gradient): integer gradients truncated", "q1", """
def backup_aggregate(arrivals, n_needed):
    if len(arrivals) < n_needed:
        raise ValueError("too few")
    order = sorted(arrivals, key=lambda a: (a[1], a[0]))
    used, dropped = order[:n_needed], order[n_needed:]
    mean = np.zeros_like(used[0][2])
    for a in used:
        mean += a[2]
    mean[:] = mean / n_needed
    return mean, sorted(a[0] for a in used), sorted(a[0] for a in dropped)
"""),
    W("[dtype] async_apply copies w0 as it is: integer parameters stay integers", "q2", """
def async_apply(w0, updates, base_lr):
    w, taus = np.copy(w0), []
    for version, (grad, version_read) in enumerate(updates):
        tau = version - version_read
        w[:] = w - base_lr / (tau + 1) * np.asarray(grad, dtype=float)
        taus.append(tau)
    return w, taus
"""),
    W("[limit] async_sgd applies one update too many", "q2", """
def async_sgd(w0, grad_fn, compute_times, n_updates, base_lr):
    w, version, log = np.array(w0, dtype=float), 0, []
    reads = [(0.0 + t, 0, w.copy()) for t in compute_times]
    while len(log) <= n_updates:
        i = min(range(len(reads)), key=lambda j: (reads[j][0], j))
        done, version_read, w_read = reads[i]
        tau = version - version_read
        w = w - base_lr / (tau + 1) * np.asarray(grad_fn(w_read), dtype=float)
        version += 1
        log.append((i, tau))
        reads[i] = (done + compute_times[i], version, w.copy())
    return w, log[:n_updates]
"""),
]

_NA_BYTES = "n/a: no byte counts"
_NA_SEARCH = "n/a: no search or range"

COVERAGE = {
    "ps04_syncasync": {
        "q1": {"order": "[order] dropped workers listed in arrival order",
               "dtype": "[dtype] mean accumulated in np.zeros_like(first gradient): integer gradients truncated",
               "itemsize": _NA_BYTES, "limit": "raises when exactly n_needed arrived (off by one)",
               "edge": "ties broken by arrival order, not worker id"},
        "q2": {"order": "async_sgd: simultaneous finishes in the order the workers were rescheduled",
               "dtype": "[dtype] async_apply copies w0 as it is: integer parameters stay integers",
               "itemsize": _NA_BYTES, "limit": "[limit] async_sgd applies one update too many",
               "edge": "async_sgd: rate divided by max(1, staleness), so tau = 1 keeps the full rate"},
    },
}
