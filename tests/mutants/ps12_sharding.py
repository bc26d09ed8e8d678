"""ps12_sharding: wrong solutions (one realistic mistake each) and correct solutions written differently."""

from __future__ import annotations

from .harness import R, W, swap

_BUCKETS = """
def assign_buckets(params, cap_bytes, itemsize=4):
    buckets, current, filled = [], [], 0
    for name, numel in reversed(params):
        current.append(name)
        filled += numel * itemsize
        if filled >= cap_bytes:
            buckets.append(current)
            current, filled = [], 0
    if current:
        buckets.append(current)
    return buckets
"""

_ENDS = """
def bucket_finish_times(buckets, nbytes, ready_s, alpha_s, beta_s):
    ends, free = [], 0.0
    for bucket in buckets:
        start = max([free] + [ready_s[name] for name in bucket])
        free = start + alpha_s + beta_s * sum(nbytes[name] for name in bucket)
        ends.append(free)
    return ends
"""

_STEP = """
def zero_adam_step(w, grads, states, lr, betas=(0.9, 0.999), eps=1e-8):
    n, (b1, b2) = len(grads), betas
    shards, new_states = [], []
    for r, state in enumerate(states):
        g = sum(shard(gk, n, r) for gk in grads) / n
        t = state["step"] + 1
        m = b1 * state["m"] + (1 - b1) * g
        v = b2 * state["v"] + (1 - b2) * g * g
        shards.append(shard(w, n, r) - lr * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps))
        new_states.append({"step": t, "m": m, "v": v})
    return np.concatenate(shards)[:len(w)], new_states
"""

_RANK = """
def rank_bytes(units, n, stage, precision="mixed"):
    held = HELD[precision]
    whole = sum(numel for _, numel in units)
    shard = sum(-(-numel // n) for _, numel in units)
    params = held["params"] * (shard if stage >= 3 else whole)
    grads = held["grads"] * (shard if stage >= 2 else whole)
    optimizer = (held["master"] + held["m"] + held["v"]) * (shard if stage >= 1 else whole)
    return {"params": params, "grads": grads, "optimizer": optimizer, "total": params + grads + optimizer}
"""

_FIT = """
def smallest_world(units, stage, budget_bytes, precision="mixed", max_n=1024):
    for n in range(1, max_n + 1):
        if rank_bytes(units, n, stage, precision)["total"] <= budget_bytes:
            return n
    return None
"""


PS12 = [
    # q1: buckets and their allreduces
    W("buckets filled in registration order, not reverse", "q1", swap(_BUCKETS, ("reversed(params)", "params"))),
    W("a bucket is closed only once it holds more than the cap (off by one)", "q1",
      swap(_BUCKETS, ("filled >= cap_bytes", "filled > cap_bytes"))),
    W("a parameter that would overflow the bucket opens a new one (buckets never exceed the cap)", "q1", """
def assign_buckets(params, cap_bytes, itemsize=4):
    buckets, current, filled = [], [], 0
    for name, numel in reversed(params):
        if current and filled + numel * itemsize > cap_bytes:
            buckets.append(current)
            current, filled = [], 0
        current.append(name)
        filled += numel * itemsize
    if current:
        buckets.append(current)
    return buckets
"""),
    W("bucket sizes counted in elements, itemsize ignored", "q1",
      swap(_BUCKETS, ("filled += numel * itemsize", "filled += numel * 4"))),
    W("a bucket starts when its first gradient is ready", "q1",
      swap(_ENDS, ("start = max([free] + [ready_s[name] for name in bucket])", "start = max(free, min(ready_s[name] for name in bucket))"))),
    W("allreduces of different buckets overlap on the link", "q1",
      swap(_ENDS, ("start = max([free] + [ready_s[name] for name in bucket])", "start = max(ready_s[name] for name in bucket)"))),
    R("buckets by an index walk that closes at the first parameter; ends with numpy arrays", "q1", """
def assign_buckets(params, cap_bytes, itemsize=4):
    out, start, filled = [], len(params), 0
    for i in range(len(params) - 1, -1, -1):
        filled += params[i][1] * itemsize
        if filled >= cap_bytes or i == 0:
            out.append([params[j][0] for j in range(start - 1, i - 1, -1)])
            start, filled = i, 0
    return out


def bucket_finish_times(buckets, nbytes, ready_s, alpha_s, beta_s):
    ready = np.array([max(ready_s[k] for k in b) for b in buckets], dtype=float)
    cost = np.array([alpha_s + beta_s * sum(nbytes[k] for k in b) for b in buckets], dtype=float)
    ends = []
    for r, c in zip(ready, cost):
        ends.append(float(max(r, ends[-1] if ends else 0.0) + c))
    return ends
"""),
    # q2: shards and the sharded Adam step
    W("shards as np.array_split: the remainder on the first ranks", "q2", """
def shard(x, n, r):
    return np.array(np.array_split(np.asarray(x, dtype=float), n)[r], dtype=float)
"""),
    W("gradients summed by the reduce-scatter, not averaged", "q2",
      swap(_STEP, ("sum(shard(gk, n, r) for gk in grads) / n", "sum(shard(gk, n, r) for gk in grads)"))),
    W("Adam without bias correction", "q2",
      swap(_STEP, ("(m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps)", "m / (np.sqrt(v) + eps)"))),
    W("bias correction with the steps taken before this one", "q2",
      swap(_STEP, ("(m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps)", "(m / (1 - b1**max(t - 1, 1))) / (np.sqrt(v / (1 - b2**max(t - 1, 1))) + eps)"))),
    W("eps inside the square root", "q2",
      swap(_STEP, ("np.sqrt(v / (1 - b2**t)) + eps", "np.sqrt(v / (1 - b2**t) + eps)"))),
    W("every rank keeps the whole vector's m and v (no optimizer sharding)", "q2", """
def zero_adam_step(w, grads, states, lr, betas=(0.9, 0.999), eps=1e-8):
    n, (b1, b2), psi = len(grads), betas, len(w)
    size = -(-psi // n)
    g = np.mean(np.array(grads, dtype=float), axis=0)
    full_m = np.concatenate([s["m"] for s in states])[:psi]
    full_v = np.concatenate([s["v"] for s in states])[:psi]
    t = states[0]["step"] + 1
    m = b1 * full_m + (1 - b1) * g
    v = b2 * full_v + (1 - b2) * g * g
    new_w = np.asarray(w, dtype=float) - lr * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps)
    return new_w, [{"step": t, "m": m.copy(), "v": v.copy()} for _ in range(n)]
"""),
    W("moments updated in place in the caller's state", "q2", """
def zero_adam_step(w, grads, states, lr, betas=(0.9, 0.999), eps=1e-8):
    n, (b1, b2) = len(grads), betas
    shards, new_states = [], []
    for r, state in enumerate(states):
        g = sum(shard(gk, n, r) for gk in grads) / n
        state["step"] += 1
        t = state["step"]
        state["m"] *= b1
        state["m"] += (1 - b1) * g
        state["v"] *= b2
        state["v"] += (1 - b2) * g * g
        m, v = state["m"], state["v"]
        shards.append(shard(w, n, r) - lr * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps))
        new_states.append(state)
    return np.concatenate(shards)[:len(w)], new_states
"""),
    R("vectorised: every gradient padded at once, the reduce-scatter as a sum over a reshaped axis", "q2", """
def shard(x, n, r):
    x = np.asarray(x, dtype=float)
    size = -(-len(x) // n)
    return np.pad(x, (0, n * size - len(x))).reshape(n, size)[r].copy()


def zero_adam_step(w, grads, states, lr, betas=(0.9, 0.999), eps=1e-8):
    n, psi = len(grads), len(w)
    size = -(-psi // n)
    g = np.pad(np.array(grads, dtype=float), ((0, 0), (0, n * size - psi))).reshape(n, n, size).mean(axis=0)
    t = np.array([s["step"] for s in states]) + 1
    m = betas[0] * np.array([s["m"] for s in states]) + (1 - betas[0]) * g
    v = betas[1] * np.array([s["v"] for s in states]) + (1 - betas[1]) * g**2
    step_size = lr / (1 - betas[0] ** t)[:, None]
    denom = np.sqrt(v) / np.sqrt(1 - betas[1] ** t)[:, None] + eps
    p = np.pad(np.asarray(w, dtype=float), (0, n * size - psi)).reshape(n, size) - step_size * m / denom
    return p.reshape(-1)[:psi], [{"step": int(t[r]), "m": m[r].copy(), "v": v[r].copy()} for r in range(n)]
"""),
    # q3: counting bytes and elements; will it fit?
    W("shards rounded down: the padding is not counted", "q3",
      swap(_RANK, ("-(-numel // n)", "numel // n"))),
    W("the whole model padded once instead of unit by unit", "q3",
      swap(_RANK, ("shard = sum(-(-numel // n) for _, numel in units)", "shard = -(-whole // n)"))),
    W("stage 2 still holds the full gradients (sharded from stage 3 on)", "q3",
      swap(_RANK, ("(shard if stage >= 2 else whole)", "(shard if stage >= 3 else whole)"))),
    W("12 bytes of optimizer state in fp32 too", "q3",
      swap(_RANK, ('(held["master"] + held["m"] + held["v"])', "12"))),
    W("a ring collective sends N shards, not N - 1", "q3", """
def elements_sent(units, n, stage):
    collectives = 3 if stage == 3 else 2
    return sum(collectives * n * -(-numel // n) for _, numel in units) if n > 1 else 0
"""),
    W("stage 3 traffic counted like stages 1 and 2", "q3", """
def elements_sent(units, n, stage):
    return sum(2 * (n - 1) * -(-numel // n) for _, numel in units)
"""),
    W("fits only strictly below the budget", "q3", swap(_FIT, ('["total"] <= budget_bytes', '["total"] < budget_bytes'))),
    W("no N fits: returns max_n instead of None", "q3", swap(_FIT, ("return None", "return max_n"))),
    R("counts with numpy arrays; smallest N by bisection (the total never grows with N)", "q3", """
def rank_bytes(units, n, stage, precision="mixed"):
    sizes = np.array([numel for _, numel in units], dtype=np.int64)
    counts = {name: int(((sizes + n - 1) // n).sum()) if stage >= level else int(sizes.sum())
              for name, level in (("params", 3), ("grads", 2), ("optimizer", 1))}
    held = HELD[precision]
    per = {"params": held["params"], "grads": held["grads"], "optimizer": held["master"] + held["m"] + held["v"]}
    out = {k: per[k] * counts[k] for k in ("params", "grads", "optimizer")}
    out["total"] = sum(out.values())
    return out


def elements_sent(units, n, stage):
    rs, ag = 1, 2 if stage == 3 else 1
    per_collective = (n - 1) * sum((numel + n - 1) // n for _, numel in units)
    return (rs + ag) * per_collective


def smallest_world(units, stage, budget_bytes, precision="mixed", max_n=1024):
    if rank_bytes(units, max_n, stage, precision)["total"] > budget_bytes:
        return None
    lo, hi = 1, max_n
    while lo < hi:
        mid = (lo + hi) // 2
        if rank_bytes(units, mid, stage, precision)["total"] <= budget_bytes:
            hi = mid
        else:
            lo = mid + 1
    return lo
"""),
]
