"""Boundary mutants for ps05-ps08 (issue 45): one wrong solution per applicable boundary class and question, each
caught by a fixed hidden case at every seed. `COVERAGE` names, per question and class, the mutant (new here or
already in the catalog) or why the class does not apply."""

from __future__ import annotations

from .harness import W

PS05 = [
    W("[order] each step's sends listed from the last rank down", "q1", """
def ring_schedule(p):
    rs = [[(r, (r + 1) % p, (r - s) % p) for r in reversed(range(p))] for s in range(p - 1)]
    ag = [[(r, (r + 1) % p, (r + 1 - s) % p) for r in reversed(range(p))] for s in range(p - 1)]
    return rs + ag
"""),
    W("[itemsize] bytes per value assumed 8 (itemsize ignored)", "q2", """
def ring_bytes_sent(log, n, p, itemsize):
    sizes = [len(c) for c in np.array_split(np.arange(n), p)]
    sent = [0] * p
    for _step, src, _dst, chunk in log:
        sent[src] += sizes[chunk] * 8
    return sent
"""),
]

PS07 = [
    W("[dtype] decoupled: w = np.copy(w0), integer parameters stay integers", "q4", """
def decoupled_sgd(w0, grad_fn, sizes, lr, steps, d):
    w = np.copy(w0)
    p = len(sizes)
    bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
    grads, applied = [], [[-1] * steps for _ in range(p)]
    for t in range(steps):
        grads.append(np.asarray(grad_fn(w, t), dtype=float))
        for s in range(p):
            old = t - d * (p - 1 - s)
            if old >= 0:
                w[bounds[s]:bounds[s + 1]] = w[bounds[s]:bounds[s + 1]] - lr * grads[old][bounds[s]:bounds[s + 1]]
                applied[s][t] = old
    return w, applied
"""),
]

_NA_BYTES = "n/a: no byte counts"
_NA_SEARCH = "n/a: no search or range"
_NA_INT = "n/a: integer inputs give the same values in any dtype (sums of integers, index arithmetic)"

COVERAGE = {
    "ps05_collectives": {
        "q1": {"order": "[order] each step's sends listed from the last rank down", "dtype": "n/a: takes only p",
               "itemsize": _NA_BYTES, "limit": "n/a: no search; p = 1 (no steps) is a visible check",
               "edge": "all-gather starts with the chunk sent last in reduce-scatter"},
        "q2": {"order": "shortcut: every rank returns the plain sum, no messages", "dtype": _NA_INT,
               "itemsize": "[itemsize] bytes per value assumed 8 (itemsize ignored)",
               "limit": "n/a: no search; more ranks than values (empty chunks) is a fixed hidden case",
               "edge": "chunk sizes n // p (the remainder forgotten)"},
    },
    "ps07_model_parallel": {
        "q1": {"order": "1F1B rule runs the backward of the newest microbatch held", "dtype": "n/a: takes only counts",
               "itemsize": _NA_BYTES, "limit": "warm-up of p - s forwards",
               "edge": "peak taken as the forwards before the first backward"},
        "q2": {"order": "n/a: finish times on a p x m grid, no list order", "dtype": _NA_INT,
               "itemsize": _NA_BYTES, "limit": _NA_SEARCH,
               "edge": "a stage runs two forwards at once (only the input is awaited)"},
        "q3": {"order": "n/a: one partial per rank, in rank order (checked as a list)", "dtype": _NA_INT,
               "itemsize": "bytes counted as float64", "limit": _NA_SEARCH,
               "edge": "split by floor index slices (remainder on the last ranks)"},
        "q4": {"order": "decoupled: the first stage is never late (delays reversed)",
               "dtype": "[dtype] decoupled: w = np.copy(w0), integer parameters stay integers",
               "itemsize": _NA_BYTES, "limit": "decoupled: every stage waits d (p - 1) steps",
               "edge": "decoupled: stages cut with np.array_split (sizes ignored)"},
    },
}
