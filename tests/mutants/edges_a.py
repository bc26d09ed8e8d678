"""Boundary mutants for ps01-ps04 (issue 45): one wrong solution per applicable boundary class and question, each
caught by a fixed hidden case at every seed. `COVERAGE` names, per question and class, the mutant (new here or
already in the catalog) or why the class does not apply."""

from __future__ import annotations

from .harness import W

PS01 = [
    W("[order] the batch's indices sorted", "q1", """
def minibatch_indices(n, batch_size, step, seed):
    if batch_size >= n:
        return np.arange(n)
    order = np.concatenate([np.random.default_rng([seed, e]).permutation(n)
                            for e in range(step * batch_size // n + 2)])
    return np.sort(order[step * batch_size:(step + 1) * batch_size])
"""),
    W("[dtype] gradient accumulated in np.zeros_like(X[0]): integer features break it", "q2", """
def logistic_grad(w, X, y):
    p = 1.0 / (1.0 + np.exp(-(X @ w)))
    g = np.zeros_like(X[0])
    for i in range(len(y)):
        g += X[i] * (p[i] - y[i])
    return g / len(y)
"""),
    W("[dtype] train keeps w in X's dtype (w[:] = ...): integer features truncate it", "q3", """
def train(X, y, lr, batch_size, steps, seed):
    w = np.zeros_like(X[0])
    for step in range(steps):
        idx = minibatch_indices(len(y), batch_size, step, seed)
        w[:] = sgd_step(w, X[idx], y[idx], lr)
    return w
"""),
]

PS02 = [
    W("[dtype] replay copies w0 as it is: an integer w0 truncates the deltas", "q2", """
def replay(w0, events):
    w, registers = np.copy(w0), {}
    for ev in events:
        if ev[0] == "read":
            registers[(ev[1], ev[2])] = w[ev[2]]
        else:
            w[ev[2]] = registers[(ev[1], ev[2])] + ev[3]
    return w
"""),
]

PS03 = [
    W("[dtype] the server copied as it is: integer parameters stay integers", "q1", """
def downpour_worker(server_w, grad_fn, lr, steps, n_fetch, n_push):
    server = np.copy(server_w)
    local, acc, pending, pushes = server.astype(float), np.zeros(len(server)), False, []
    for step in range(steps):
        if step % n_fetch == 0:
            local = server.astype(float)
        g = grad_fn(local)
        local = local - lr * g
        acc += g
        pending = True
        if (step + 1) % n_push == 0:
            server[:] = server - lr * acc
            acc[:] = 0
            pending = False
            pushes.append(step)
    if pending:
        server[:] = server - lr * acc
        pushes.append(steps - 1)
    return server, pushes
"""),
]

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
    "ps01_sgd": {
        "q1": {"order": "[order] the batch's indices sorted", "dtype": "n/a: takes integers only",
               "itemsize": _NA_BYTES, "limit": "full batch only when batch_size > n (off by one)",
               "edge": "a batch never straddles two epochs (short last batch)"},
        "q2": {"order": "n/a: one vector, elementwise",
               "dtype": "[dtype] gradient accumulated in np.zeros_like(X[0]): integer features break it",
               "itemsize": _NA_BYTES, "limit": _NA_SEARCH, "edge": "gradient returned as a column vector"},
        "q3": {"order": "n/a: returns one vector",
               "dtype": "[dtype] train keeps w in X's dtype (w[:] = ...): integer features truncate it",
               "itemsize": _NA_BYTES, "limit": "steps counted from 1",
               "edge": "a fresh random batch per step instead of the sampler"},
    },
    "ps02_hogwild": {
        "q1": {"order": "n/a: the touched coordinates are written whatever their order",
               "dtype": "n/a: the update is in place on the caller's float w, as the question asks",
               "itemsize": _NA_BYTES, "limit": _NA_SEARCH, "edge": "returns the nonzeros of w, not the coordinates written"},
        "q2": {"order": "replay adds atomically (ignores the register)",
               "dtype": "[dtype] replay copies w0 as it is: an integer w0 truncates the deltas",
               "itemsize": _NA_BYTES, "limit": _NA_SEARCH,
               "edge": "lost_updates counts overwrite events, not updates that never landed"},
    },
    "ps03_ps": {
        "q1": {"order": "n/a: push steps are produced in order by any loop",
               "dtype": "[dtype] the server copied as it is: integer parameters stay integers",
               "itemsize": _NA_BYTES, "limit": "flush at the end even with nothing accumulated",
               "edge": "no final flush of the accumulator"},
        "q2": {"order": "version incremented before the staleness is taken", "dtype": "n/a: events carry no numbers",
               "itemsize": _NA_BYTES, "limit": _NA_SEARCH, "edge": "a worker that never fetched counts as fresh"},
    },
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
