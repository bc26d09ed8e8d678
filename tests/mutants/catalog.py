"""For every assignment: wrong solutions (one realistic mistake each) and correct solutions written differently.

Each variant's code redefines only the functions it changes; the rest of the notebook keeps the reference solution.
"""

from __future__ import annotations

from .boundary import VARIANTS as BOUNDARY_VARIANTS
from .harness import R, Variant, W, swap
from .ps12_sharding import PS12
from .ps13_transformer import PS13

_SAMPLER = """
def minibatch_indices(n, batch_size, step, seed):
    if batch_size {cmp} n:
        return np.arange(n)
    pos, remaining, parts = step * batch_size, batch_size, []
    while remaining:
        epoch, offset = divmod(pos, n)
        take = min(remaining, n - offset)
        parts.append(np.random.default_rng([seed, epoch]).permutation(n)[offset:offset + take])
        pos, remaining = pos + take, remaining - take
    return np.concatenate(parts)
"""

PS01 = [
    W("full batch only when batch_size > n (off by one)", "q1", _SAMPLER.format(cmp=">")),
    W("epoch index is the step", "q1", """
def minibatch_indices(n, batch_size, step, seed):
    if batch_size >= n:
        return np.arange(n)
    return np.random.default_rng([seed, step]).permutation(n)[:batch_size]
"""),
    W("a batch never straddles two epochs (short last batch)", "q1", """
def minibatch_indices(n, batch_size, step, seed):
    if batch_size >= n:
        return np.arange(n)
    epoch, offset = divmod(step * batch_size, n)
    return np.random.default_rng([seed, epoch]).permutation(n)[offset:offset + batch_size]
"""),
    W("seed and epoch swapped in the generator", "q1", """
def minibatch_indices(n, batch_size, step, seed):
    if batch_size >= n:
        return np.arange(n)
    order = np.concatenate([np.random.default_rng([e, seed]).permutation(n) for e in range(step * batch_size // n + 2)])
    return order[step * batch_size:(step + 1) * batch_size]
"""),
    W("sgd_step updates w in place", "q2", """
def sgd_step(w, X, y, lr):
    w -= lr * logistic_grad(w, X, y)
    return w
"""),
    W("gradient summed, not averaged", "q2", """
def logistic_grad(w, X, y):
    p = 1.0 / (1.0 + np.exp(-(X @ w)))
    return X.T @ (p - y)
"""),
    W("gradient returned as a column vector", "q2", """
def logistic_grad(w, X, y):
    p = 1.0 / (1.0 + np.exp(-(X @ w)))
    return (X.T @ (p - y) / len(y)).reshape(-1, 1)
"""),
    W("steps counted from 1", "q3", """
def train(X, y, lr, batch_size, steps, seed):
    w = np.zeros(X.shape[1])
    for step in range(1, steps + 1):
        idx = minibatch_indices(len(y), batch_size, step, seed)
        w = sgd_step(w, X[idx], y[idx], lr)
    return w
"""),
    W("a fresh random batch per step instead of the sampler", "q3", """
def train(X, y, lr, batch_size, steps, seed):
    w = np.zeros(X.shape[1])
    rng = np.random.default_rng(seed)
    for step in range(steps):
        idx = np.arange(len(y)) if batch_size >= len(y) else rng.choice(len(y), batch_size, replace=False)
        w = sgd_step(w, X[idx], y[idx], lr)
    return w
"""),
    R("sampler: one concatenated order, sliced", "q1", """
def minibatch_indices(n, batch_size, step, seed):
    if batch_size >= n:
        return np.arange(n)
    start = step * batch_size
    last = (start + batch_size - 1) // n
    order = np.concatenate([np.random.default_rng([seed, e]).permutation(n) for e in range(start // n, last + 1)])
    return order[start - (start // n) * n:][:batch_size]
"""),
    R("sampler: position by position", "q1", """
def minibatch_indices(n, batch_size, step, seed):
    if batch_size >= n:
        return np.arange(n)
    perms, out = {}, []
    for pos in range(step * batch_size, (step + 1) * batch_size):
        e = pos // n
        if e not in perms:
            perms[e] = np.random.default_rng([seed, e]).permutation(n)
        out.append(perms[e][pos % n])
    return np.array(out)
"""),
    R("gradient and step written out with explicit names", "q2", """
def logistic_grad(w, X, y):
    z = X @ w
    p = np.exp(-np.logaddexp(0.0, -z))
    return (X.T @ (p - y)) / X.shape[0]


def sgd_step(w, X, y, lr):
    new = w.copy()
    new -= lr * logistic_grad(w, X, y)
    return new
"""),
]

PS02 = [
    W("p recomputed after each coordinate is written", "q1", """
def sparse_logistic_update(w, cols, vals, label, lr):
    for c, v in zip(cols, vals):
        p = 1.0 / (1.0 + np.exp(-np.dot(w[list(cols)], vals)))
        w[c] -= lr * (p - label) * v
    return len(cols)
"""),
    W("gradient not multiplied by the values", "q1", """
def sparse_logistic_update(w, cols, vals, label, lr):
    cols = np.asarray(cols)
    p = 1.0 / (1.0 + np.exp(-np.dot(w[cols], vals)))
    w[cols] -= lr * (p - label)
    return len(cols)
"""),
    W("returns the nonzeros of w, not the coordinates written", "q1", """
def sparse_logistic_update(w, cols, vals, label, lr):
    cols, vals = np.asarray(cols), np.asarray(vals, dtype=float)
    p = 1.0 / (1.0 + np.exp(-np.dot(w[cols], vals)))
    w[cols] -= lr * (p - label) * vals
    return int(np.count_nonzero(w))
"""),
    W("replay writes into the caller's w0", "q2", """
def replay(w0, events):
    w, registers = np.asarray(w0, dtype=float), {}
    for ev in events:
        if ev[0] == "read":
            registers[(ev[1], ev[2])] = w[ev[2]]
        else:
            w[ev[2]] = registers[(ev[1], ev[2])] + ev[3]
    return w
"""),
    W("replay adds atomically (ignores the register)", "q2", """
def replay(w0, events):
    w = np.array(w0, dtype=float)
    for ev in events:
        if ev[0] == "write":
            w[ev[2]] += ev[3]
    return w
"""),
    W("lost_updates counts overwrite events, not updates that never landed", "q2", """
def lost_updates(events):
    writes_since_read, lost = {}, 0
    for ev in events:
        kind, worker, c = ev[0], ev[1], ev[2]
        if kind == "read":
            writes_since_read[(worker, c)] = 0
        else:
            lost += writes_since_read.get((worker, c), 0)
            for (other, col) in writes_since_read:
                if col == c and other != worker:
                    writes_since_read[(other, col)] += 1
    return lost
"""),
    W("lost_updates counts the writes that overwrote something", "q2", """
def lost_updates(events):
    last_read, lost = {}, 0
    for i, ev in enumerate(events):
        if ev[0] == "read":
            last_read[ev[1]] = i
        elif any(e[0] == "write" and e[2] == ev[2] and e[1] != ev[1] for e in events[last_read[ev[1]] + 1:i]):
            lost += 1
    return lost
"""),
    R("sparse update coordinate by coordinate, p computed once", "q1", """
def sparse_logistic_update(w, cols, vals, label, lr):
    z = sum(w[c] * v for c, v in zip(cols, vals))
    err = 1.0 / (1.0 + np.exp(-z)) - label
    for c, v in zip(cols, vals):
        w[c] = w[c] - lr * err * v
    return len(list(cols))
"""),
    R("lost updates as intended minus landed (replay with unit deltas)", "q2", """
def lost_updates(events):
    coords = 1 + max([ev[2] for ev in events], default=0)
    unit = [ev if ev[0] == "read" else ("write", ev[1], ev[2], 1.0) for ev in events]
    intended = sum(1 for ev in events if ev[0] == "write")
    return int(round(intended - replay(np.zeros(coords), unit).sum()))
"""),
    R("replay on a Python list, registers per worker", "q2", """
def replay(w0, events):
    w, reg = [float(v) for v in w0], {}
    for ev in events:
        if ev[0] == "read":
            reg[ev[1]] = w[ev[2]]
        else:
            w[ev[2]] = reg[ev[1]] + ev[3]
    return np.array(w)
"""),
]

_DOWNPOUR = """
def downpour_worker(server_w, grad_fn, lr, steps, n_fetch, n_push):
    server = np.array(server_w, dtype=float)
    local, acc, pending, pushes = server.copy(), np.zeros_like(server), False, []
    for step in range(steps):
        if step % n_fetch == 0:
            local = {fetch}
        g = grad_fn(local)
        local -= lr * g
        acc += g
        pending = True
        if (step + 1) % n_push == 0:
            server -= lr * acc
            acc[:] = 0
            pending = False
            pushes.append(step)
    if {flush}:
        server -= lr * acc
        pushes.append(steps - 1)
    return server, pushes
"""

PS03 = [
    W("no final flush of the accumulator", "q1", _DOWNPOUR.format(fetch="server.copy()", flush="False")),
    W("fetch aliases the server (no copy)", "q1", _DOWNPOUR.format(fetch="server", flush="pending")),
    W("flush at the end even with nothing accumulated", "q1", _DOWNPOUR.format(fetch="server.copy()", flush="True")),
    W("pushes the mean of the accumulated gradients", "q1", """
def downpour_worker(server_w, grad_fn, lr, steps, n_fetch, n_push):
    server = np.array(server_w, dtype=float)
    local, acc, count, pushes = server.copy(), np.zeros_like(server), 0, []
    for step in range(steps):
        if step % n_fetch == 0:
            local = server.copy()
        g = grad_fn(local)
        local -= lr * g
        acc += g
        count += 1
        if (step + 1) % n_push == 0:
            server -= lr * acc / count
            acc[:] = 0
            count = 0
            pushes.append(step)
    if count:
        server -= lr * acc / count
        pushes.append(steps - 1)
    return server, pushes
"""),
    W("version incremented before the staleness is taken", "q2", """
def push_staleness(events):
    version, fetched, out = 0, {}, []
    for kind, worker in events:
        if kind == "fetch":
            fetched[worker] = version
        else:
            version += 1
            out.append(version - fetched.get(worker, 0))
    return out
"""),
    W("staleness from the worker's first fetch", "q2", """
def push_staleness(events):
    version, fetched, out = 0, {}, []
    for kind, worker in events:
        if kind == "fetch":
            fetched.setdefault(worker, version)
        else:
            out.append(version - fetched.get(worker, 0))
            version += 1
    return out
"""),
    W("a worker that never fetched counts as fresh", "q2", """
def push_staleness(events):
    version, fetched, out = 0, {}, []
    for kind, worker in events:
        if kind == "fetch":
            fetched[worker] = version
        else:
            out.append(version - fetched.get(worker, version))
            version += 1
    return out
"""),
    R("push on a counter of steps since the last push", "q1", """
def downpour_worker(server_w, grad_fn, lr, steps, n_fetch, n_push):
    server = np.array(server_w, dtype=float, copy=True)
    local = server.copy()
    acc = np.zeros_like(server)
    since, pushes = 0, []
    for step in range(steps):
        if step % n_fetch == 0:
            local = np.copy(server)
        g = grad_fn(local)
        local = local - lr * g
        acc = acc + g
        since += 1
        if since == n_push:
            server = server - lr * acc
            acc, since = np.zeros_like(server), 0
            pushes.append(step)
    if since:
        server = server - lr * acc
        pushes.append(steps - 1)
    return server, pushes
"""),
    R("staleness from a count of pushes", "q2", """
def push_staleness(events):
    pushes = [i for i, (kind, _) in enumerate(events) if kind == "push"]
    out = []
    for n, i in enumerate(pushes):
        worker = events[i][1]
        last = max([j for j in range(i) if events[j] == ("fetch", worker)], default=None)
        read = 0 if last is None else sum(1 for j in pushes if j < last)
        out.append(n - read)
    return out
"""),
]

_ASYNC = """
def async_sgd(w0, grad_fn, compute_times, n_updates, base_lr):
    w, version, log = np.array(w0, dtype=float), 0, []
    reads = [(0.0 + t, 0, w.copy()) for t in compute_times]
    while len(log) < n_updates:
        i = min(range(len(reads)), key=lambda j: (reads[j][0], j))
        done, version_read, w_read = reads[i]
        tau = version - version_read
        w = w - base_lr / (tau + 1) * np.asarray(grad_fn(w_read), dtype=float)
        version += 1
        log.append((i, tau))
        reads[i] = (done + compute_times[i], version, w.copy())
    return w, log
"""

PS04 = [
    W("ties broken by arrival order, not worker id", "q1", """
def backup_aggregate(arrivals, n_needed):
    if len(arrivals) < n_needed:
        raise ValueError("too few")
    order = sorted(arrivals, key=lambda a: a[1])
    used, dropped = order[:n_needed], order[n_needed:]
    return np.mean([a[2] for a in used], axis=0), sorted(a[0] for a in used), sorted(a[0] for a in dropped)
"""),
    W("raises when exactly n_needed arrived (off by one)", "q1", """
def backup_aggregate(arrivals, n_needed):
    if len(arrivals) <= n_needed:
        raise ValueError("too few")
    order = sorted(arrivals, key=lambda a: (a[1], a[0]))
    used, dropped = order[:n_needed], order[n_needed:]
    return np.mean([a[2] for a in used], axis=0), sorted(a[0] for a in used), sorted(a[0] for a in dropped)
"""),
    W("sums the used gradients", "q1", """
def backup_aggregate(arrivals, n_needed):
    if len(arrivals) < n_needed:
        raise ValueError("too few")
    order = sorted(arrivals, key=lambda a: (a[1], a[0]))
    used, dropped = order[:n_needed], order[n_needed:]
    return np.sum([a[2] for a in used], axis=0), sorted(a[0] for a in used), sorted(a[0] for a in dropped)
"""),
    W("async_apply updates the caller's w0 in place", "q2", """
def async_apply(w0, updates, base_lr):
    w, taus = np.asarray(w0, dtype=float), []
    for version, (grad, version_read) in enumerate(updates):
        tau = version - version_read
        w -= base_lr / (tau + 1) * np.asarray(grad, dtype=float)
        taus.append(tau)
    return w, taus
"""),
    W("versions counted from 1", "q2", """
def async_apply(w0, updates, base_lr):
    w, taus = np.array(w0, dtype=float), []
    for version, (grad, version_read) in enumerate(updates, start=1):
        tau = version - version_read
        w -= base_lr / (tau + 1) * np.asarray(grad, dtype=float)
        taus.append(tau)
    return w, taus
"""),
    W("async_sgd: rate divided by max(1, staleness), so tau = 1 keeps the full rate", "q2",
      swap(_ASYNC, ("(tau + 1)", "max(1, tau)"))),
    W("async_apply: rate divided by the staleness alone, guarded at 0", "q2", """
def async_apply(w0, updates, base_lr):
    w, taus = np.array(w0, dtype=float), []
    for version, (grad, version_read) in enumerate(updates):
        tau = version - version_read
        w = w - base_lr / max(1, tau) * np.asarray(grad, dtype=float)
        taus.append(tau)
    return w, taus
"""),
    W("async_sgd: gradient of the server's current parameters, not the ones read", "q2",
      swap(_ASYNC, ("grad_fn(w_read)", "grad_fn(w)"))),
    W("async_sgd: simultaneous finishes in the order the workers were rescheduled", "q2", """
import heapq

def async_sgd(w0, grad_fn, compute_times, n_updates, base_lr):
    w, version, log, seq = np.array(w0, dtype=float), 0, [], len(compute_times)
    heap = [(float(t), i, i, 0, w.copy()) for i, t in enumerate(compute_times)]
    heapq.heapify(heap)
    while len(log) < n_updates:
        t, _, i, read, w_read = heapq.heappop(heap)
        w = w - base_lr / (version - read + 1) * np.asarray(grad_fn(w_read), dtype=float)
        log.append((i, version - read))
        version += 1
        heapq.heappush(heap, (t + compute_times[i], seq, i, version, w.copy()))
        seq += 1
    return w, log
"""),
    W("async_sgd: the worker keeps its first read (never re-reads)", "q2",
      swap(_ASYNC, ("reads[i] = (done + compute_times[i], version, w.copy())", "reads[i] = (done + compute_times[i], version_read, w_read)"))),
    W("async_sgd: staleness measured after the version is bumped", "q2",
      swap(_ASYNC, ("        tau = version - version_read\n", "        version += 1\n        tau = version - version_read\n"),
           ("        version += 1\n        log.append", "        log.append"))),
    W("async_sgd: updates the caller's w0 in place", "q2",
      swap(_ASYNC, ("w, version, log = np.array(w0, dtype=float), 0, []", "w, version, log = w0, 0, []"),
           ("w = w - base_lr", "w -= base_lr"))),
    R("select with heapq.nsmallest", "q1", """
import heapq

def backup_aggregate(arrivals, n_needed):
    if n_needed > len(arrivals):
        raise ValueError("not enough gradients")
    used = heapq.nsmallest(n_needed, arrivals, key=lambda a: (a[1], a[0]))
    used_ids = {a[0] for a in used}
    mean = sum(np.asarray(a[2], dtype=float) for a in used) / n_needed
    return mean, sorted(used_ids), sorted(a[0] for a in arrivals if a[0] not in used_ids)
"""),
    R("explicit version counter, rate rule by cases", "q2", """
def async_apply(w0, updates, base_lr):
    w = np.copy(np.asarray(w0, dtype=float))
    version, taus = 0, []
    for grad, version_read in updates:
        taus.append(version - version_read)
        lr = base_lr if taus[-1] == 0 else base_lr / (taus[-1] + 1)
        w = w - lr * np.asarray(grad, dtype=float)
        version += 1
    return w, taus
"""),
    R("async_sgd on a heap of (finish time, worker id)", "q2", """
import heapq

def async_sgd(w0, grad_fn, compute_times, n_updates, base_lr):
    w = np.array(w0, dtype=float)
    heap = [(float(t), i, 0, w.copy()) for i, t in enumerate(compute_times)]
    heapq.heapify(heap)
    log = []
    while len(log) < n_updates:
        t, i, read, w_read = heapq.heappop(heap)
        tau = len(log) - read
        w = w - base_lr / (tau + 1) * np.asarray(grad_fn(w_read), dtype=float)
        log.append((i, tau))
        heapq.heappush(heap, (t + compute_times[i], i, len(log), w.copy()))
    return w, log
"""),
    R("async_sgd stepping a clock and scanning the workers", "q2", """
def async_sgd(w0, grad_fn, compute_times, n_updates, base_lr):
    w, version, log = np.array(w0, dtype=float), 0, []
    finish = [float(t) for t in compute_times]
    read = [(0, w.copy()) for _ in compute_times]
    while len(log) < n_updates:
        now = min(finish)
        for i in range(len(finish)):  # every worker done now, smaller ids first
            if finish[i] == now and len(log) < n_updates:
                v, w_read = read[i]
                g = np.asarray(grad_fn(w_read), dtype=float)
                w = w - base_lr * g / (version - v + 1)
                log.append((i, version - v))
                version += 1
                read[i] = (version, w.copy())
                finish[i] = now + compute_times[i]
    return w, log
"""),
]

_RING = """
def ring_allreduce(arrays, log=None):
    N = len(arrays)
    chunks = [[c.astype(float).copy() for c in np.array_split(np.asarray(a), N)] for a in arrays]
    for t, step in enumerate(ring_schedule(N)):
        sent = [(dst, chunk, chunks[src][chunk].copy()) for src, dst, chunk in step]
        if log is not None:
            log.extend((t, src, dst, chunk) for src, dst, chunk in step)
        for dst, chunk, data in sent:
            if t < N - 1{gather}:
                chunks[dst][chunk] += data
            else:
                chunks[dst][chunk] = data
    return [np.concatenate(c) for c in chunks]
"""

_RANK = """
def ring_allreduce_rank(comm, x):
    N, r = comm.world, comm.rank
    chunks = [c.clone() for c in torch.tensor_split(x, N)]
    right, left = (r + 1) % N, (r - 1) % N
    for t in range(2 * (N - 1)):
        reduce = t < N - 1
        out = (r - t) % N if reduce else (r + 1 - (t - N + 1)) % N
        inc = (out - 1) % N
        buf = torch.empty_like(chunks[inc])
        comm.exchange(chunks[out], right, buf, left, step=t, phase="reduce-scatter" if reduce else "all-gather",
                      chunk=out)
        chunks[inc] = chunks[inc] + buf if reduce else buf
    return torch.cat(chunks)
"""

PS05 = [
    W("all-gather restarts at chunk (r - t), not (r + 1 - t)", "q1", """
def ring_schedule(N):
    rs = [[(r, (r + 1) % N, (r - t) % N) for r in range(N)] for t in range(N - 1)]
    return rs + [[(r, (r + 1) % N, (r - t) % N) for r in range(N)] for t in range(N - 1)]
"""),
    W("reduce-scatter sends chunk (r + t)", "q1", """
def ring_schedule(N):
    rs = [[(r, (r + 1) % N, (r + t) % N) for r in range(N)] for t in range(N - 1)]
    ag = [[(r, (r + 1) % N, (r + 1 - t) % N) for r in range(N)] for t in range(N - 1)]
    return rs + ag
"""),
    W("shortcut: every rank returns the plain sum, no messages", "q2", """
def ring_allreduce(arrays, log=None):
    total = np.sum([np.asarray(a, dtype=float) for a in arrays], axis=0)
    return [total.copy() for _ in arrays]
"""),
    W("all-gather adds instead of replacing", "q2", _RING.format(gather=" or True")),
    W("chunks are views of the inputs (inputs modified)", "q2", """
def ring_allreduce(arrays, log=None):
    N = len(arrays)
    chunks = [np.array_split(a, N) for a in arrays]
    for t, step in enumerate(ring_schedule(N)):
        sent = [(dst, chunk, chunks[src][chunk].copy()) for src, dst, chunk in step]
        if log is not None:
            log.extend((t, src, dst, chunk) for src, dst, chunk in step)
        for dst, chunk, data in sent:
            if t < N - 1:
                chunks[dst][chunk] += data
            else:
                chunks[dst][chunk] = data
    return [np.concatenate(c) for c in chunks]
"""),
    W("bytes from the formula 2 (N - 1) / N * K * itemsize for every rank", "q2", """
def ring_bytes_sent(log, K, N, itemsize):
    return [2 * (N - 1) / N * K * itemsize] * N
"""),
    W("bytes counted at the receiver", "q2", """
def ring_bytes_sent(log, K, N, itemsize):
    sizes = [len(c) for c in np.array_split(np.arange(K), N)]
    sent = [0] * N
    for _step, _src, dst, chunk in log:
        sent[dst] += sizes[chunk] * itemsize
    return sent
"""),
    W("chunk sizes K // N (the remainder forgotten)", "q2", """
def ring_bytes_sent(log, K, N, itemsize):
    sent = [0] * N
    for _step, src, _dst, _chunk in log:
        sent[src] += K // N * itemsize
    return sent
"""),
    W("values counted, not bytes", "q2", """
def ring_bytes_sent(log, K, N, itemsize):
    sizes = [len(c) for c in np.array_split(np.arange(K), N)]
    sent = [0] * N
    for _step, src, _dst, chunk in log:
        sent[src] += sizes[chunk]
    return sent
"""),
    W("all-gather starts with the chunk sent last in reduce-scatter", "q1", """
def ring_schedule(N):
    rs = [[(r, (r + 1) % N, (r - t) % N) for r in range(N)] for t in range(N - 1)]
    return rs + [[(r, (r + 1) % N, (r + 2 - t) % N) for r in range(N)] for t in range(N - 1)]
"""),
    R("schedule built step by step with appends", "q1", """
def ring_schedule(N):
    steps = []
    for phase, shift in (("reduce-scatter", 0), ("all-gather", 1)):
        for t in range(N - 1):
            step = []
            for r in range(N):
                step.append((r, (r + 1) % N, (r + shift - t) % N))
            steps.append(step)
    return steps
"""),
    R("ring on flat buffers with chunk offsets", "q2", """
def ring_allreduce(arrays, log=None):
    N = len(arrays)
    bufs = [np.array(a, dtype=float) for a in arrays]
    K = len(bufs[0]) if N else 0
    sizes = [len(c) for c in np.array_split(np.arange(K), N)] if N else []
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(int) if N else []
    for t, step in enumerate(ring_schedule(N)):
        msgs = []
        for src, dst, c in step:
            msgs.append((dst, c, bufs[src][starts[c]:starts[c + 1]].copy()))
            if log is not None:
                log.append((t, src, dst, c))
        for dst, c, data in msgs:
            if t < N - 1:
                bufs[dst][starts[c]:starts[c + 1]] = bufs[dst][starts[c]:starts[c + 1]] + data
            else:
                bufs[dst][starts[c]:starts[c + 1]] = data
    return bufs


def ring_bytes_sent(log, K, N, itemsize):
    q, extra = divmod(K, N) if N else (0, 0)
    sent = np.zeros(N, dtype=int)
    for _step, src, _dst, chunk in log:
        sent[src] += (q + (chunk < extra)) * itemsize
    return sent.tolist()
"""),
]

PS06 = [
    W("t_1 is the first measurement", "q1", """
def speedup_efficiency(threads, seconds):
    threads, seconds = np.asarray(threads, dtype=float), np.asarray(seconds, dtype=float)
    speedup = seconds[0] / seconds
    return speedup, speedup / threads
"""),
    W("t_1 is the slowest measurement", "q1", """
def speedup_efficiency(threads, seconds):
    threads, seconds = np.asarray(threads, dtype=float), np.asarray(seconds, dtype=float)
    speedup = seconds.max() / seconds
    return speedup, speedup / threads
"""),
    W("Amdahl fit with an intercept", "q2", """
def amdahl_fraction(threads, speedups):
    T, S = np.asarray(threads, dtype=float), np.asarray(speedups, dtype=float)
    keep = T > 1
    return float(np.polyfit(1 - 1 / T[keep], 1 / S[keep] - 1 / T[keep], 1)[0])
"""),
    W("fraction returned as lstsq's one-element array", "q2", """
def amdahl_fraction(threads, speedups):
    T, S = np.asarray(threads, dtype=float), np.asarray(speedups, dtype=float)
    keep = T > 1
    x, y = 1 - 1 / T[keep], 1 / S[keep] - 1 / T[keep]
    return np.linalg.lstsq(x[:, None], y, rcond=None)[0]
"""),
    W("serial and parallel parts swapped", "q2", """
def amdahl_speedup(s, T):
    return 1.0 / ((1.0 - s) + s / T)
"""),
    W("returns the first T that misses", "q3", """
def threads_worth_using(s, min_efficiency, max_threads):
    for T in range(1, max_threads + 1):
        if amdahl_speedup(s, T) / T < min_efficiency:
            return T
    return max_threads
"""),
    W("never tries max_threads itself", "q3", """
def threads_worth_using(s, min_efficiency, max_threads):
    best = 1
    for T in range(1, max_threads):
        if amdahl_speedup(s, T) / T < min_efficiency:
            break
        best = T
    return best
"""),
    R("t_1 looked up in a dict", "q1", """
def speedup_efficiency(threads, seconds):
    t1 = dict(zip([int(t) for t in threads], [float(S) for S in seconds]))[1]
    speedup = np.array([t1 / float(S) for S in seconds])
    return speedup, speedup / np.asarray(threads, dtype=float)
"""),
    R("largest acceptable T over the whole range", "q3", """
def threads_worth_using(s, min_efficiency, max_threads):
    ok = [T for T in range(1, max_threads + 1) if amdahl_speedup(s, T) / T >= min_efficiency]
    return max(ok, default=1)
"""),
]

_GREEDY_1F1B = """
from collections import deque

def one_f_one_b(p, m, s):
    out, held, nxt = [], deque(), 0
    while len(out) < 2 * m:
        if nxt < m and len(held) < p - s:
            out.append(("F", nxt))
            held.append(nxt)
            nxt += 1
        else:
            out.append(("B", held.popleft()))
    return out
"""

_DECOUPLED = """
def decoupled_sgd(w0, grad_fn, sizes, lr, steps, d):
    w = np.array(w0, dtype=float)
    p = len(sizes)
    bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
    grads, applied = [], [[-1] * steps for _ in range(p)]
    for t in range(steps):
        grads.append(np.asarray(grad_fn(w, t), dtype=float))
        for s in range(p):
            old = t - d * (p - 1 - s)
            if old >= 0:
                w[bounds[s]:bounds[s + 1]] -= lr * grads[old][bounds[s]:bounds[s + 1]]
                applied[s][t] = old
    return w, applied
"""

PS07 = [
    W("warm-up of p - s forwards", "q1", """
def one_f_one_b(p, m, s):
    w = min(p - s, m)
    out = [("F", k) for k in range(w)]
    for i in range(m - w):
        out += [("F", w + i), ("B", i)]
    return out + [("B", k) for k in range(m - w, m)]
"""),
    W("peak taken as the forwards before the first backward", "q1", """
def peak_activations(actions):
    kinds = [kind for kind, _ in actions]
    return kinds.index("B") if "B" in kinds else len(kinds)
"""),
    W("peak counts every forward", "q1", """
def peak_activations(actions):
    return sum(1 for kind, _ in actions if kind == "F")
"""),
    W("step time from the formula with the slowest stage", "q2", """
def gpipe_step_time(t_f, t_b, m):
    return (m + len(t_f) - 1) * (max(t_f) + max(t_b))
"""),
    W("backward starts before the last forward (no flush)", "q2", """
def gpipe_times(t_f, t_b, m):
    t_f, t_b = np.asarray(t_f, dtype=float), np.asarray(t_b, dtype=float)
    p = len(t_f)
    fwd, bwd = np.zeros((p, m)), np.zeros((p, m))
    for s in range(p):
        for k in range(m):
            fwd[s, k] = max(fwd[s - 1, k] if s else 0.0, fwd[s, k - 1] if k else 0.0) + t_f[s]
    for s in reversed(range(p)):
        for k in range(m):
            grad = bwd[s + 1, k] if s < p - 1 else fwd[p - 1, k]
            bwd[s, k] = max(grad, bwd[s, k - 1] if k else 0.0) + t_b[s]
    return fwd, bwd
"""),
    W("a stage runs two forwards at once (only the input is awaited)", "q2", """
def gpipe_times(t_f, t_b, m):
    t_f, t_b = np.asarray(t_f, dtype=float), np.asarray(t_b, dtype=float)
    p = len(t_f)
    fwd, bwd = np.zeros((p, m)), np.zeros((p, m))
    for s in range(p):
        for k in range(m):
            fwd[s, k] = (fwd[s - 1, k] if s else k * t_f[0]) + t_f[s]
    for s in reversed(range(p)):
        for k in range(m):
            grad = bwd[s + 1, k] if s < p - 1 else fwd[p - 1, m - 1]
            bwd[s, k] = max(grad, bwd[s, k - 1] if k else 0.0) + t_b[s]
    return fwd, bwd
"""),
    W("bubble from the equal-stage formula", "q2", """
def bubble(t_f, t_b, m):
    p = len(t_f)
    return np.full(p, (p - 1) / (m + p - 1))
"""),
    W("split by floor index slices (remainder on the last ranks)", "q3", """
def partial_outputs(X, A, B, N):
    h = A.shape[1]
    bounds = [r * h // N for r in range(N + 1)]
    return [np.maximum(X @ A[:, lo:hi], 0) @ B[lo:hi] for lo, hi in zip(bounds[:-1], bounds[1:])]
"""),
    W("relu applied after the partial product", "q3", """
def partial_outputs(X, A, B, N):
    return [np.maximum(X @ a @ b, 0) for a, b in zip(np.array_split(A, N, axis=1), np.array_split(B, N, axis=0))]
"""),
    W("bytes counted as float64", "q3", """
def allreduce_bytes(rows, d_out, N):
    return 2 * (N - 1) / N * 8 * rows * d_out
"""),
    R("1F1B with next-forward and next-backward counters", "q1", """
def one_f_one_b(p, m, s):
    warm = min(p - 1 - s, m)
    f = b = 0
    out = []
    while f < warm:
        out.append(("F", f)); f += 1
    while f < m:
        out.append(("F", f)); f += 1
        out.append(("B", b)); b += 1
    while b < m:
        out.append(("B", b)); b += 1
    return out


def peak_activations(actions):
    return int(max(np.cumsum([1 if k == "F" else -1 for k, _ in actions]), default=0)) if actions else 0
"""),
    R("GPipe by events: microbatch outer, stage inner, a free-at time per stage", "q2", """
def gpipe_times(t_f, t_b, m):
    p = len(t_f)
    free = [0.0] * p
    fwd = [[0.0] * m for _ in range(p)]
    bwd = [[0.0] * m for _ in range(p)]
    for k in range(m):
        for s in range(p):
            fwd[s][k] = free[s] = max(fwd[s - 1][k] if s > 0 else 0.0, free[s]) + float(t_f[s])
    for k in range(m):
        for s in range(p - 1, -1, -1):
            ready = bwd[s + 1][k] if s + 1 < p else fwd[p - 1][m - 1]
            bwd[s][k] = free[s] = max(ready, free[s]) + float(t_b[s])
    return np.array(fwd), np.array(bwd)


def bubble(t_f, t_b, m):
    step = gpipe_step_time(t_f, t_b, m)
    return np.array([(step - m * (f + b)) / step for f, b in zip(t_f, t_b)])
"""),
    R("Megatron split with explicit bounds", "q3", """
def partial_outputs(X, A, B, N):
    h = A.shape[1]
    size, extra = divmod(h, N)
    out, lo = [], 0
    for r in range(N):
        hi = lo + size + (1 if r < extra else 0)
        out.append(np.maximum(X @ A[:, lo:hi], 0.0) @ B[lo:hi, :])
        lo = hi
    return out
"""),
    W("1F1B rule with one microbatch too few in flight (p - 1 - s)", "q1",
      swap(_GREEDY_1F1B, ("len(held) < p - s", "len(held) < max(1, p - 1 - s)"))),
    W("1F1B rule runs the backward of the newest microbatch held", "q1",
      swap(_GREEDY_1F1B, ("held.popleft()", "held.pop()"))),
    W("decoupled: the first stage is never late (delays reversed)", "q4",
      swap(_DECOUPLED, ("old = t - d * (p - 1 - s)", "old = t - d * s"))),
    W("decoupled: every stage waits d (p - 1) steps", "q4",
      swap(_DECOUPLED, ("old = t - d * (p - 1 - s)", "old = t - d * (p - 1)"))),
    W("decoupled: delay d (p - s), the last stage late too", "q4",
      swap(_DECOUPLED, ("old = t - d * (p - 1 - s)", "old = t - d * (p - s)"))),
    W("decoupled: the old batch recomputed on the current weights (no weight stashing)", "q4", """
def decoupled_sgd(w0, grad_fn, sizes, lr, steps, d):
    w = np.array(w0, dtype=float)
    p = len(sizes)
    bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
    applied = [[-1] * steps for _ in range(p)]
    for t in range(steps):
        new = w.copy()
        for s in range(p):
            old = t - d * (p - 1 - s)
            if old >= 0:
                g = np.asarray(grad_fn(w, old), dtype=float)
                new[bounds[s]:bounds[s + 1]] -= lr * g[bounds[s]:bounds[s + 1]]
                applied[s][t] = old
        w = new
    return w, applied
"""),
    W("decoupled: stages cut with np.array_split (sizes ignored)", "q4", """
def decoupled_sgd(w0, grad_fn, sizes, lr, steps, d):
    w = np.array(w0, dtype=float)
    p = len(sizes)
    idx = np.array_split(np.arange(len(w)), p)
    grads, applied = [], [[-1] * steps for _ in range(p)]
    for t in range(steps):
        grads.append(np.asarray(grad_fn(w, t), dtype=float))
        for s in range(p):
            old = t - d * (p - 1 - s)
            if old >= 0:
                w[idx[s]] -= lr * grads[old][idx[s]]
                applied[s][t] = old
    return w, applied
"""),
    W("decoupled: updates the caller's w0 in place", "q4",
      swap(_DECOUPLED, ("w = np.array(w0, dtype=float)", "w = w0"))),
    R("1F1B by its in-flight rule (a deque of held microbatches)", "q1", _GREEDY_1F1B),
    R("decoupled with a queue of pending gradients per stage", "q4", """
from collections import deque

def decoupled_sgd(w0, grad_fn, sizes, lr, steps, d):
    w = np.array(w0, dtype=float)
    p = len(sizes)
    cuts = np.cumsum(sizes)[:-1]
    pending = [deque() for _ in range(p)]
    applied = np.full((p, steps), -1)
    for t in range(steps):
        parts = np.split(np.asarray(grad_fn(w, t), dtype=float), cuts)
        views = np.split(w, cuts)  # views into w
        for s in range(p):
            pending[s].append((t, parts[s]))
            if len(pending[s]) > d * (p - 1 - s):
                old, g = pending[s].popleft()
                views[s] -= lr * g
                applied[s, t] = old
    return w, applied.tolist()
"""),
]

PS08 = [
    W("plain mean, counts ignored", "q1", """
def weighted_average(models, counts):
    return np.mean([np.asarray(m, dtype=float) for m in models], axis=0)
"""),
    W("scales the caller's models in place", "q1", """
def weighted_average(models, counts):
    total = float(sum(counts))
    for m, c in zip(models, counts):
        m *= c / total
    return np.sum(models, axis=0)
"""),
    W("replicas averaged equally", "q2", """
def local_sgd_round(w, shards, lr, H):
    replicas = []
    for X, y in shards:
        v = np.array(w, dtype=float)
        for _ in range(H):
            v = v - lr * X.T @ (X @ v - y) / len(y)
        replicas.append(v)
    return weighted_average(replicas, [1] * len(replicas))
"""),
    W("gradient summed over rows, not averaged", "q2", """
def local_sgd_round(w, shards, lr, H):
    replicas, rows = [], []
    for X, y in shards:
        v = np.array(w, dtype=float)
        for _ in range(H):
            v = v - lr * X.T @ (X @ v - y)
        replicas.append(v)
        rows.append(len(y))
    return weighted_average(replicas, rows)
"""),
    W("every worker starts from the previous worker's replica", "q2", """
def local_sgd_round(w, shards, lr, H):
    replicas, rows = [], []
    v = np.array(w, dtype=float)
    for X, y in shards:
        for _ in range(H):
            v = v - lr * X.T @ (X @ v - y) / len(y)
        replicas.append(v)
        rows.append(len(y))
    return weighted_average(replicas, rows)
"""),
    W("m rounded half up instead of Python's round", "q3", """
def fedavg_bytes(n_params, clients, fraction, rounds):
    m = max(1, int(fraction * clients + 0.5))
    return rounds * m * 2 * 4 * n_params
"""),
    W("m truncated", "q3", """
def fedavg_bytes(n_params, clients, fraction, rounds):
    m = max(1, int(fraction * clients))
    return rounds * m * 2 * 4 * n_params
"""),
    R("average with an explicit running sum", "q1", """
def weighted_average(models, counts):
    total = float(sum(counts))
    acc = np.zeros(len(models[0]))
    for m, c in zip(models, counts):
        acc = acc + (c / total) * np.asarray(m, dtype=float)
    return acc
"""),
    R("round with np.average over stacked replicas", "q2", """
def local_sgd_round(w, shards, lr, H):
    replicas = []
    for X, y in shards:
        v = np.copy(np.asarray(w, dtype=float))
        for _ in range(H):
            v -= lr * (X.T @ (X @ v - y)) / X.shape[0]
        replicas.append(v)
    return np.average(np.stack(replicas), axis=0, weights=[len(y) for _, y in shards])
"""),
    R("bytes with the factors in another order", "q3", """
def fedavg_bytes(n_params, clients, fraction, rounds):
    per_round = max(1, round(clients * fraction))
    return 8 * n_params * per_round * rounds
"""),
]


_ONE_BIT = """
def one_bit(v):
    v = np.asarray(v, dtype=float)
    ones = v {cmp} 0
    out = np.empty_like(v)
    if ones.any():
        out[ones] = v[ones].mean()
    if (~ones).any():
        out[~ones] = v[~ones].mean()
    return out
"""

_FEEDBACK = """
def error_feedback(grads, feedback=True):
    grads = [np.asarray(g, dtype=float) for g in grads]
    residual = np.zeros_like(grads[0])
    sent = []
    for g in grads:
        target = g + residual if feedback else g
        q = one_bit(target)
        sent.append(q)
        if feedback:
            residual = {residual}
    return sent, residual
"""

PS09 = [
    W("zero counted as negative", "q1", _ONE_BIT.format(cmp=">")),
    W("one scale for both signs: sign(v) * mean|v|", "q1", """
def one_bit(v):
    v = np.asarray(v, dtype=float)
    return np.where(v >= 0, 1.0, -1.0) * np.abs(v).mean()
"""),
    W("decodes in place into the caller's array", "q1", """
def one_bit(v):
    ones = v >= 0
    pos = v[ones].mean() if ones.any() else 0.0
    neg = v[~ones].mean() if (~ones).any() else 0.0
    v[ones], v[~ones] = pos, neg
    return v
"""),
    W("residual kept from the gradient alone (e = g - q)", "q2", _FEEDBACK.format(residual="g - q")),
    W("residual accumulates the whole target (e = e + g - q)", "q2", _FEEDBACK.format(residual="residual + target - q")),
    W("quantises the gradient, then adds the old residual to what is sent", "q2", """
def error_feedback(grads, feedback=True):
    grads = [np.asarray(g, dtype=float) for g in grads]
    residual = np.zeros_like(grads[0])
    sent = []
    for g in grads:
        q = one_bit(g) + (residual if feedback else 0)
        sent.append(q)
        if feedback:
            residual = g + residual - q
    return sent, residual
"""),
    W("every message is the same reused buffer", "q2", """
def error_feedback(grads, feedback=True):
    grads = [np.asarray(g, dtype=float) for g in grads]
    residual = np.zeros_like(grads[0])
    buf = np.zeros_like(grads[0])
    sent = []
    for g in grads:
        target = g + residual if feedback else g
        buf[:] = one_bit(target)
        sent.append(buf)
        if feedback:
            residual = target - buf
    return sent, residual
"""),
    R("one_bit with np.where and the two means", "q1", """
def one_bit(v):
    x = np.array(v, dtype=float)
    pos, neg = x >= 0, x < 0
    hi = x[pos].sum() / max(1, pos.sum())
    lo = x[neg].sum() / max(1, neg.sum())
    return np.where(pos, hi, lo)
"""),
    R("error feedback with the identity kept as a running total", "q2", """
def error_feedback(grads, feedback=True):
    total_g = np.zeros(len(grads[0]))
    total_q = np.zeros(len(grads[0]))
    sent = []
    for g in grads:
        g = np.asarray(g, dtype=float)
        total_g = total_g + g
        q = one_bit(total_g - total_q) if feedback else one_bit(g)
        total_q = total_q + q
        sent.append(q)
    return sent, (total_g - total_q) if feedback else np.zeros(len(grads[0]))
"""),
]

_PORT = """
def fifo_port(arrivals, nbytes, alpha_s, bandwidth_Bps):
    done, free = np.zeros(len(arrivals)), 0.0
    for j in sorted(range(len(arrivals)), key=lambda j: (arrivals[j], j)):
        hold = alpha_s + (nbytes[j] / bandwidth_Bps if bandwidth_Bps else 0.0)
        free = done[j] = max(free, arrivals[j]) + hold
    return done
"""

_STALE = """
import heapq

def async_staleness(durations, n_updates):
    durations = np.asarray(durations, dtype=float)
    heap = [(durations[i, 0], i, 0, 0) for i in range(len(durations))]
    heapq.heapify(heap)
    out = []
    while heap and len(out) < n_updates:
        t, i, k, read = heapq.heappop(heap)
        out.append((i, len(out) - read))
        if k + 1 < durations.shape[1]:
            heapq.heappush(heap, (t + durations[i, k + 1], i, k + 1, len(out)))
    return out
"""

PS10 = [
    W("port: delivery times in service order, not indexed like the inputs", "q1", """
def fifo_port(arrivals, nbytes, alpha_s, bandwidth_Bps):
    out, free = [], 0.0
    for j in sorted(range(len(arrivals)), key=lambda j: (arrivals[j], j)):
        free = max(free, arrivals[j]) + alpha_s + (nbytes[j] / bandwidth_Bps if bandwidth_Bps else 0.0)
        out.append(free)
    return np.array(out)
"""),
    W("port: no queue, every message delivered at arrival + its time", "q1",
      swap(_PORT, ("max(free, arrivals[j]) + hold", "arrivals[j] + hold"))),
    W("port: served in index order, not arrival order", "q1",
      swap(_PORT, ("sorted(range(len(arrivals)), key=lambda j: (arrivals[j], j))", "range(len(arrivals))"))),
    W("server: replies go out in parallel (no outbound queue)", "q1", """
def server_allreduce_s(ready, nbytes, alpha_s, bandwidth_Bps):
    if len(ready) == 0:
        return 0.0
    gathered = float(fifo_port(ready, [nbytes] * len(ready), alpha_s, bandwidth_Bps).max())
    return gathered + alpha_s + nbytes / bandwidth_Bps
"""),
    W("server: replies start at the last ready time, not the last delivery", "q1", """
def server_allreduce_s(ready, nbytes, alpha_s, bandwidth_Bps):
    if len(ready) == 0:
        return 0.0
    return float(fifo_port([max(ready)] * len(ready), [nbytes] * len(ready), alpha_s, bandwidth_Bps).max())
"""),
    W("staleness counted the papers' way (one more)", "q2",
      swap(_STALE, ("out.append((i, len(out) - read))", "out.append((i, len(out) - read + 1))"))),
    W("staleness: simultaneous finishes in the order the workers were rescheduled", "q2", """
import heapq

def async_staleness(durations, n_updates):
    durations = np.asarray(durations, dtype=float)
    heap = [(durations[i, 0], i, i, 0, 0) for i in range(len(durations))]
    heapq.heapify(heap)
    out, seq = [], len(durations)
    while heap and len(out) < n_updates:
        t, _, i, k, read = heapq.heappop(heap)
        out.append((i, len(out) - read))
        if k + 1 < durations.shape[1]:
            heapq.heappush(heap, (t + durations[i, k + 1], seq, i, k + 1, len(out)))
            seq += 1
    return out
"""),
    W("staleness: every gradient takes the worker's first duration", "q2",
      swap(_STALE, ("(t + durations[i, k + 1], i, k + 1, len(out))", "(t + durations[i, 0], i, k + 1, len(out))"))),
    W("staleness: the worker keeps its first read", "q2",
      swap(_STALE, ("(t + durations[i, k + 1], i, k + 1, len(out))", "(t + durations[i, k + 1], i, k + 1, read)"))),
    R("port with numpy argsort (stable) and a running free time", "q1", """
def fifo_port(arrivals, nbytes, alpha_s, bandwidth_Bps):
    arrivals = np.asarray(arrivals, dtype=float)
    hold = alpha_s + (np.asarray(nbytes, dtype=float) / bandwidth_Bps if bandwidth_Bps else 0.0)
    hold = np.broadcast_to(hold, arrivals.shape)
    done, free = np.empty_like(arrivals), 0.0
    for j in np.argsort(arrivals, kind="stable"):
        free = done[j] = max(free, arrivals[j]) + hold[j]
    return done


def server_allreduce_s(ready, nbytes, alpha_s, bandwidth_Bps):
    n = len(ready)
    if not n:
        return 0.0
    back = fifo_port(np.full(n, fifo_port(ready, np.full(n, nbytes), alpha_s, bandwidth_Bps).max()),
                     np.full(n, nbytes), alpha_s, bandwidth_Bps)
    return float(back[-1])
"""),
    R("staleness with a sorted event list (bisect) and per-worker state", "q2", """
import bisect

def async_staleness(durations, n_updates):
    d = [list(map(float, row)) for row in durations]
    events = sorted((row[0], i) for i, row in enumerate(d))
    k, read, out = [0] * len(d), [0] * len(d), []
    while events and len(out) < n_updates:
        t, i = events.pop(0)
        out.append((i, len(out) - read[i]))
        read[i], k[i] = len(out), k[i] + 1
        if k[i] < len(d[i]):
            bisect.insort(events, (t + d[i][k[i]], i))
    return out
"""),
]


PS11 = [
    W("Comm ring: shortcut, every rank sends its whole vector round the ring", "q1", """
def ring_allreduce_rank(comm, x):
    p, r = comm.world, comm.rank
    acc, cur = x.clone(), x.clone()
    for s in range(p - 1):
        buf = torch.empty_like(cur)
        comm.exchange(cur, (r + 1) % p, buf, (r - 1) % p, step=s, phase="reduce-scatter", chunk=-1)
        acc, cur = acc + buf, buf
    return acc
"""),
    W("Comm ring: all-gather adds instead of replacing", "q1",
      swap(_RANK, ("chunks[inc] + buf if reduce else buf", "chunks[inc] + buf"))),
    W("Comm ring: chunks are views of x (the input is modified)", "q1",
      swap(_RANK, ("[c.clone() for c in torch.tensor_split(x, N)]", "list(torch.tensor_split(x, N))"),
           ("chunks[inc] = chunks[inc] + buf if reduce else buf", "if reduce:\n            chunks[inc] += buf\n        else:\n            chunks[inc][...] = buf"))),
    W("Comm ring: all-gather steps numbered from 0 again", "q1",
      swap(_RANK, ("comm.exchange(chunks[out], right, buf, left, step=t,", "comm.exchange(chunks[out], right, buf, left, step=t if reduce else t - N + 1,"))),
    W("Comm ring: the received chunk added to the chunk just sent", "q1",
      swap(_RANK, ("buf = torch.empty_like(chunks[inc])", "buf = torch.empty_like(chunks[out])"),
           ("chunks[inc] = chunks[inc] + buf if reduce else buf", "chunks[out] = chunks[out] + buf if reduce else buf"))),
    W("Comm ring: torch.chunk's ceil-sized chunks, not np.array_split's", "q1",
      swap(_RANK, ("[c.clone() for c in torch.tensor_split(x, N)]", "[c.clone() for c in torch.chunk(x, N)] + [x[:0].clone()] * (N - len(torch.chunk(x, N)))"))),
    W("Comm ring: receive buffers in torch's default float32", "q1",
      swap(_RANK, ("buf = torch.empty_like(chunks[inc])", "buf = torch.empty(len(chunks[inc]))"))),
    R("Comm ring: the received chunk first (addition commutes exactly)", "q1",
      swap(_RANK, ("chunks[inc] + buf if reduce else buf", "buf + chunks[inc] if reduce else buf"))),
    R("Comm ring on one flat buffer with chunk offsets, returned as numpy", "q1", """
def ring_allreduce_rank(comm, x):
    p, r = comm.world, comm.rank
    buf = x.clone()
    q, extra = divmod(len(buf), p)
    start = [c * q + min(c, extra) for c in range(p + 1)]
    for s in range(2 * (p - 1)):
        phase = "reduce-scatter" if s < p - 1 else "all-gather"
        send_c = (r - s) % p if s < p - 1 else (r + 2 + p - 1 - s - 1) % p
        recv_c = (send_c - 1) % p
        got = torch.empty(start[recv_c + 1] - start[recv_c], dtype=buf.dtype)
        comm.exchange(buf[start[send_c]:start[send_c + 1]].clone(), (r + 1) % p, got, (r - 1) % p,
                      step=s, phase=phase, chunk=send_c)
        if s < p - 1:
            buf[start[recv_c]:start[recv_c + 1]] += got
        else:
            buf[start[recv_c]:start[recv_c + 1]] = got
    return buf.numpy()
"""),
    W("log: elements counted, not bytes", "q2", """
def log_bytes(log):
    return (sum(m["elements"] * 1 for m in log if m["direction"] == "send"),
            sum(m["elements"] for m in log if m["direction"] == "recv"))
"""),
    W("busiest link: recv records counted too (each message twice)", "q2", """
def busiest_link(logs):
    load = {}
    for log in logs:
        for m in log:
            load[(m["src"], m["dst"])] = load.get((m["src"], m["dst"]), 0) + m["bytes"]
    return max(load, key=lambda pair: (load[pair], pair)) if load else None
"""),
    W("busiest link: the most messages, not the most bytes", "q2", """
def busiest_link(logs):
    load = {}
    for log in logs:
        for m in log:
            if m["direction"] == "send":
                load[(m["src"], m["dst"])] = load.get((m["src"], m["dst"]), 0) + 1
    return min(load, key=lambda pair: (-load[pair], pair)) if load else None
"""),
    R("log read with collections.Counter and sorted()", "q2", """
from collections import Counter

def log_bytes(log):
    c = Counter()
    for m in log:
        c[m["direction"]] += m["bytes"]
    return c["send"], c["recv"]


def busiest_link(logs):
    load = Counter()
    for m in (m for log in logs for m in log if m["direction"] == "send"):
        load[(m["src"], m["dst"])] += m["bytes"]
    return sorted(load, key=lambda pair: (-load[pair], pair))[0] if load else None
"""),
    W("Comm ring: sends to the left neighbour, receives from the right", "q1",
      swap(_RANK, ("right, left = (r + 1) % N, (r - 1) % N", "right, left = (r - 1) % N, (r + 1) % N"))),
]


CATALOG: dict[str, list[Variant]] = {
    "ps01_sgd": PS01, "ps02_hogwild": PS02, "ps03_ps": PS03, "ps04_syncasync": PS04,
    "ps05_collectives": PS05, "ps06_threads": PS06, "ps07_model_parallel": PS07, "ps08_averaging": PS08,
    "ps09_onebit": PS09, "ps10_sim": PS10,
    "ps11_ring_comm": PS11,
    "ps12_sharding": PS12,
    "ps13_transformer": PS13,
}
for _name, _extra in BOUNDARY_VARIANTS.items():
    CATALOG[_name] = CATALOG[_name] + _extra
