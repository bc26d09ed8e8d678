"""Boundary mutants for ps05-ps08 (issue 45): one wrong solution per applicable boundary class and question, each
caught by a fixed hidden case at every seed. `COVERAGE` names, per question and class, the mutant (new here or
already in the catalog) or why the class does not apply."""

from __future__ import annotations

from .harness import W

PS05 = [
    W("[order] each step's sends listed from the last rank down", "q1", """
def ring_schedule(N):
    rs = [[(r, (r + 1) % N, (r - t) % N) for r in reversed(range(N))] for t in range(N - 1)]
    ag = [[(r, (r + 1) % N, (r + 1 - t) % N) for r in reversed(range(N))] for t in range(N - 1)]
    return rs + ag
"""),
    W("[itemsize] bytes per value assumed 8 (itemsize ignored)", "q2", """
def ring_bytes_sent(log, K, N, itemsize):
    sizes = [len(c) for c in np.array_split(np.arange(K), N)]
    sent = [0] * N
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

PS06 = [
    W("[dtype] speed-up stored in np.empty_like(seconds): integer times truncate it", "q1", """
def speedup_efficiency(threads, seconds):
    threads, seconds = np.asarray(threads), np.asarray(seconds)
    speedup = np.empty_like(seconds)
    speedup[:] = seconds[threads == 1][0] / seconds
    return speedup, speedup / threads
"""),
]

PS08 = [
    W("[dtype] average accumulated in np.zeros_like(models[0]): integer models truncate it", "q1", """
def weighted_average(models, counts):
    out = np.zeros_like(models[0])
    for m, c in zip(models, counts):
        out += c * m
    out[:] = out / sum(counts)
    return out
"""),
    W("[dtype] each replica starts as w.copy(): an integer w truncates the steps", "q2", """
def local_sgd_round(w, shards, lr, H):
    replicas, rows = [], []
    for X, y in shards:
        v = w.copy()
        for _ in range(H):
            v[:] = v - lr * X.T @ (X @ v - y) / len(y)
        replicas.append(v)
        rows.append(len(y))
    return weighted_average(replicas, rows)
"""),
    W("[itemsize] float64 parameters (8 bytes each)", "q3", """
def fedavg_bytes(n_params, clients, fraction, rounds):
    return rounds * max(1, round(fraction * clients)) * 2 * 8 * n_params
"""),
]

_NA_BYTES = "n/a: no byte counts"
_NA_SEARCH = "n/a: no search or range"
_NA_INT = "n/a: integer inputs give the same values in any dtype (sums of integers, index arithmetic)"

COVERAGE = {
    "ps06_threads": {
        "q1": {"order": "t_1 is the first measurement",
               "dtype": "[dtype] speed-up stored in np.empty_like(seconds): integer times truncate it",
               "itemsize": "n/a: no byte counts", "limit": "n/a: no search or range",
               "edge": "t_1 is the slowest measurement"},
        "q2": {"order": "n/a: the fit is a sum over points", "dtype": "n/a: thread counts are integers in the visible tests",
               "itemsize": "n/a: no byte counts", "limit": "n/a: no search or range", "edge": "Amdahl fit with an intercept"},
        "q3": {"order": "n/a: returns one count", "dtype": "n/a: takes numbers only",
               "itemsize": "n/a: no byte counts", "limit": "never tries max_threads itself",
               "edge": "returns the first T that misses"},
    },
    "ps08_averaging": {
        "q1": {"order": "n/a: a weighted sum", "itemsize": "n/a: no byte counts", "limit": "n/a: no search or range",
               "dtype": "[dtype] average accumulated in np.zeros_like(models[0]): integer models truncate it",
               "edge": "plain mean, counts ignored"},
        "q2": {"order": "every worker starts from the previous worker's replica",
               "dtype": "[dtype] each replica starts as w.copy(): an integer w truncates the steps",
               "itemsize": "n/a: no byte counts", "limit": "n/a: no search or range", "edge": "replicas averaged equally"},
        "q3": {"order": "n/a: returns one count", "dtype": "n/a: takes numbers only",
               "itemsize": "[itemsize] float64 parameters (8 bytes each)",
               "limit": "m truncated", "edge": "m rounded half up instead of Python's round"},
    },
    "ps05_collectives": {
        "q1": {"order": "[order] each step's sends listed from the last rank down", "dtype": "n/a: takes only N",
               "itemsize": _NA_BYTES, "limit": "n/a: no search; N = 1 (no steps) is a visible check",
               "edge": "all-gather starts with the chunk sent last in reduce-scatter"},
        "q2": {"order": "shortcut: every rank returns the plain sum, no messages", "dtype": _NA_INT,
               "itemsize": "[itemsize] bytes per value assumed 8 (itemsize ignored)",
               "limit": "n/a: no search; more ranks than values (empty chunks) is a fixed hidden case",
               "edge": "chunk sizes K // N (the remainder forgotten)"},
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
