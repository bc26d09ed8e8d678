"""ps13_transformer: wrong solutions (one realistic mistake each) and correct solutions written differently."""

from __future__ import annotations

from .harness import R, W, swap

BLOCK_REFERENCE = """
def block_attention(q, k, v, mask=None):
    q, k, v = (np.asarray(x, dtype=float) for x in (q, k, v))
    scores = q @ k.T / np.sqrt(q.shape[1])
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    top = scores.max(axis=1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    weights = np.exp(scores - top)
    total = weights.sum(axis=1, keepdims=True)
    with np.errstate(divide="ignore"):
        ell = (top + np.log(total))[:, 0]
    o = np.where(total > 0, weights @ v / np.where(total > 0, total, 1.0), 0.0)
    return o, ell
"""

_MERGE = """
def merge(o1, l1, o2, l2):
    o1, l1, o2, l2 = (np.asarray(x, dtype=float) for x in (o1, l1, o2, l2))
    top = np.maximum(l1, l2)
    ell = top + np.log(np.exp(l1 - top) + np.exp(l2 - top))
    return np.exp(l1 - ell)[:, None] * o1 + np.exp(l2 - ell)[:, None] * o2, ell
"""

_MESH = """
def mesh_rank(sizes, coords):
    rank = 0
    for axis in ("pp", "dp", "cp", "tp"):
        rank = rank * sizes[axis] + coords[axis]
    return rank


def axis_groups(sizes, axis):
    order = ("pp", "dp", "cp", "tp")
    groups = {}
    for index in np.ndindex(*(sizes[a] for a in order)):
        coords = dict(zip(order, index))
        others = tuple(coords[a] for a in order if a != axis)
        groups.setdefault(others, []).append(mesh_rank(sizes, coords))
    return sorted(groups.values())
"""

ROUTE_REFERENCE = """
def route(logits, top_k, capacity_factor):
    logits = np.asarray(logits, dtype=float)
    n_experts = logits.shape[-1]
    flat = logits.reshape(-1, n_experts)
    tokens = len(flat)
    probs = np.exp(flat - flat.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    expert = np.argsort(-probs, axis=1, kind="stable")[:, :top_k]
    chosen = np.take_along_axis(probs, expert, axis=1)
    gate = chosen if top_k == 1 else chosen / chosen.sum(axis=1, keepdims=True)
    capacity = math.ceil(capacity_factor * tokens * top_k / n_experts)
    filled = np.zeros(n_experts, dtype=int)
    keep = np.zeros((tokens, top_k), dtype=bool)
    for choice in range(top_k):
        for t in range(tokens):
            e = expert[t, choice]
            keep[t, choice] = filled[e] < capacity
            filled[e] += 1
    return {"expert": expert, "gate": gate, "keep": keep, "capacity": capacity,
            "tokens_per_expert": np.bincount(expert.ravel(), minlength=n_experts),
            "kept_per_expert": np.bincount(expert[keep], minlength=n_experts),
            "dropped_tokens": int((~keep.any(axis=1)).sum())}
"""

_BYTES = """
def activation_bytes(b, s, h, layers, m, tp, pp, cp, stage, itemsize=4, sequence_parallel=False):
    tokens, blocks = s // cp, layers // pp
    rows = b * tokens * h
    tp_elements = 4 * blocks * m * 2 * (tp - 1) / tp * rows
    boundaries = (stage > 0) + (stage < pp - 1)
    pp_elements = boundaries * m * (rows // tp if sequence_parallel else rows)
    cp_elements = blocks * m * (6 * (cp - 1) + 2) * rows // tp if cp > 1 else 0
    return {"tp": tp_elements * itemsize, "pp": pp_elements * itemsize, "cp": cp_elements * itemsize}
"""


PS13 = [
    # q1: a block's partial attention and the online-softmax merge
    W("block attention without subtracting the row's largest score (overflows)", "q1",
      swap(BLOCK_REFERENCE, ("weights = np.exp(scores - top)", "weights = np.exp(scores)"),
           ("ell = (top + np.log(total))[:, 0]", "ell = np.log(total)[:, 0]"))),
    W("scores not scaled by 1/sqrt(h/a)", "q1", swap(BLOCK_REFERENCE, ("q @ k.T / np.sqrt(q.shape[1])", "q @ k.T"))),
    W("masked scores set to -1e9: a query that sees no key gets the mean of v and a finite ell", "q1",
      swap(BLOCK_REFERENCE, ("np.where(mask, scores, -np.inf)", "np.where(mask, scores, -1e9)"))),
    W("ell is the row's largest score (the max kept, the sum forgotten)", "q1",
      swap(BLOCK_REFERENCE, ("ell = (top + np.log(total))[:, 0]", "ell = np.where(total > 0, top, -np.inf)[:, 0]"))),
    W("merge without rescaling the older output", "q1",
      swap(_MERGE, ("np.exp(l1 - ell)[:, None] * o1", "o1"))),
    W("merge by exp(l1) and exp(l2) without a max subtracted (overflows)", "q1", """
def merge(o1, l1, o2, l2):
    o1, l1, o2, l2 = (np.asarray(x, dtype=float) for x in (o1, l1, o2, l2))
    w1, w2 = np.exp(l1), np.exp(l2)
    return (w1[:, None] * o1 + w2[:, None] * o2) / (w1 + w2)[:, None], np.log(w1 + w2)
"""),
    W("merged ell is the larger of the two, and the outputs are not renormalised", "q1",
      swap(_MERGE, ("ell = top + np.log(np.exp(l1 - top) + np.exp(l2 - top))", "ell = top"))),
    W("merge as l1 + log1p(exp(l2 - l1)): fails when the first block is masked", "q1", """
def merge(o1, l1, o2, l2):
    o1, l1, o2, l2 = (np.asarray(x, dtype=float) for x in (o1, l1, o2, l2))
    with np.errstate(over="ignore", invalid="ignore"):
        ell = l1 + np.log1p(np.exp(l2 - l1))
    return np.exp(l1 - ell)[:, None] * o1 + np.exp(l2 - ell)[:, None] * o2, ell
"""),
    R("torch: logsumexp and softmax per block (masked rows zeroed); merge by np.logaddexp", "q1", """
def block_attention(q, k, v, mask=None):
    import torch
    q, k, v = (torch.as_tensor(np.asarray(x, dtype=np.float64)) for x in (q, k, v))
    scores = q @ k.T / q.shape[1] ** 0.5
    if mask is not None:
        scores = scores.masked_fill(~torch.as_tensor(np.asarray(mask, dtype=bool)), float("-inf"))
    ell = torch.logsumexp(scores, dim=1)
    seen = torch.isfinite(ell)
    p = torch.where(seen[:, None], torch.exp(scores - torch.where(seen, ell, 0.0)[:, None]), 0.0)
    return (p @ v).numpy(), ell.numpy()


def merge(o1, l1, o2, l2):
    ell = np.logaddexp(l1, l2)
    return np.exp(np.subtract(l1, ell))[:, None] * o1 + np.exp(np.subtract(l2, ell))[:, None] * o2, ell
"""),
    R("(max, sum) pairs as Milakov & Gimelshein keep them, row by row; ell = m + log d at the end", "q1", """
def block_attention(q, k, v, mask=None):
    q, k, v = np.asarray(q, dtype=float), np.asarray(k, dtype=float), np.asarray(v, dtype=float)
    out, ells = np.zeros((len(q), v.shape[1])), np.full(len(q), -np.inf)
    for i, row in enumerate(q):
        seen = np.ones(len(k), bool) if mask is None else np.asarray(mask[i], bool)
        if not seen.any():
            continue
        s = k[seen] @ row / np.sqrt(len(row))
        m = s.max()
        d = np.exp(s - m).sum()
        out[i] = np.exp(s - m) @ v[seen] / d
        ells[i] = m + np.log(d)
    return out, ells


def merge(o1, l1, o2, l2):
    o = np.empty(np.shape(o1))
    ell = np.empty(len(l1))
    for i in range(len(l1)):
        a, b = float(l1[i]), float(l2[i])
        m = max(a, b)
        d = (math.exp(a - m) if a > -math.inf else 0.0) + (math.exp(b - m) if b > -math.inf else 0.0)
        ell[i] = m + math.log(d)
        o[i] = (math.exp(a - ell[i]) * np.asarray(o1[i]) if a > -math.inf else 0.0) + \\
               (math.exp(b - ell[i]) * np.asarray(o2[i]) if b > -math.inf else 0.0)
    return o, ell
"""),
    # q2: a mesh's ranks and the groups of each axis
    W("axes read the wrong way round: tensor outermost, pipeline fastest", "q2",
      swap(_MESH, ('for axis in ("pp", "dp", "cp", "tp"):', 'for axis in ("tp", "cp", "dp", "pp"):'),
           ('order = ("pp", "dp", "cp", "tp")', 'order = ("tp", "cp", "dp", "pp")'))),
    W("data outermost, then pipeline (pp and dp swapped)", "q2",
      swap(_MESH, ('for axis in ("pp", "dp", "cp", "tp"):', 'for axis in ("dp", "pp", "cp", "tp"):'),
           ('order = ("pp", "dp", "cp", "tp")', 'order = ("dp", "pp", "cp", "tp")'))),
    W("context innermost (cp and tp swapped)", "q2",
      swap(_MESH, ('for axis in ("pp", "dp", "cp", "tp"):', 'for axis in ("pp", "dp", "tp", "cp"):'),
           ('order = ("pp", "dp", "cp", "tp")', 'order = ("pp", "dp", "tp", "cp")'))),
    W("every axis's groups are runs of neighbouring ranks (right for tp only)", "q2", """
def axis_groups(sizes, axis):
    world = sizes["pp"] * sizes["dp"] * sizes["cp"] * sizes["tp"]
    return [list(range(start, start + sizes[axis])) for start in range(0, world, sizes[axis])]
"""),
    W("every axis's groups strided by N / size (right for the outermost axis only)", "q2", """
def axis_groups(sizes, axis):
    world = sizes["pp"] * sizes["dp"] * sizes["cp"] * sizes["tp"]
    stride = world // sizes[axis]
    return [list(range(start, world, stride)) for start in range(stride)]
"""),
    W("an axis of size 1 has no groups", "q2",
      swap(_MESH, ("    return sorted(groups.values())", "    return sorted(groups.values()) if sizes[axis] > 1 else []"))),
    R("numpy: arange(N).reshape(p, N_dp, N_cp, N_tp), the axis moved last", "q2", """
def mesh_rank(sizes, coords):
    shape = [sizes[a] for a in ("pp", "dp", "cp", "tp")]
    return int(np.ravel_multi_index([coords[a] for a in ("pp", "dp", "cp", "tp")], shape))


def axis_groups(sizes, axis):
    order = ["pp", "dp", "cp", "tp"]
    grid = np.arange(int(np.prod([sizes[a] for a in order]))).reshape([sizes[a] for a in order])
    rows = np.moveaxis(grid, order.index(axis), -1).reshape(-1, sizes[axis])
    return sorted(rows.tolist(), key=lambda g: g[0])
"""),
    R("strides: an axis's stride is the product of the sizes inside it", "q2", """
def mesh_rank(sizes, coords):
    stride, rank = 1, 0
    for axis in ("tp", "cp", "dp", "pp"):
        rank += coords[axis] * stride
        stride *= sizes[axis]
    return rank


def axis_groups(sizes, axis):
    order = ("pp", "dp", "cp", "tp")
    inner = 1
    for a in order[order.index(axis) + 1:]:
        inner *= sizes[a]
    world = inner * sizes[axis]
    for a in order[:order.index(axis)]:
        world *= sizes[a]
    starts = [r for r in range(world) if (r // inner) % sizes[axis] == 0]
    return [[s + i * inner for i in range(sizes[axis])] for s in starts]
"""),
    # q3: top-k routing with a capacity
    W("capacity counted per sequence: each sequence routed as its own group", "q3",
      ROUTE_REFERENCE.replace("def route(", "def _route_group(") + """

def route(logits, top_k, capacity_factor):
    parts = [_route_group(seq, top_k, capacity_factor) for seq in np.asarray(logits, dtype=float)]
    out = {key: np.concatenate([p[key] for p in parts]) for key in ("expert", "gate", "keep")}
    out["capacity"] = parts[0]["capacity"]
    for key in ("tokens_per_expert", "kept_per_expert", "dropped_tokens"):
        out[key] = sum(p[key] for p in parts)
    return out
"""),
    W("slots claimed token by token (each token's choices together), not first choices first", "q3",
      swap(ROUTE_REFERENCE, ("""    for choice in range(top_k):
        for t in range(tokens):""", """    for t in range(tokens):
        for choice in range(top_k):"""))),
    W("capacity without the top-k factor", "q3",
      swap(ROUTE_REFERENCE, ("math.ceil(capacity_factor * tokens * top_k / n_experts)",
                    "math.ceil(capacity_factor * tokens / n_experts)"))),
    W("capacity rounded down", "q3",
      swap(ROUTE_REFERENCE, ("math.ceil(capacity_factor * tokens * top_k / n_experts)",
                    "int(capacity_factor * tokens * top_k / n_experts)"))),
    W("an expert keeps capacity + 1 assignments (off by one)", "q3",
      swap(ROUTE_REFERENCE, ("filled[e] < capacity", "filled[e] <= capacity"))),
    W("chosen experts listed by index, not best first", "q3",
      swap(ROUTE_REFERENCE, ('np.argsort(-probs, axis=1, kind="stable")[:, :top_k]',
                    'np.sort(np.argsort(-probs, axis=1, kind="stable")[:, :top_k], axis=1)'))),
    W("top-k gates not renormalised", "q3",
      swap(ROUTE_REFERENCE, ("gate = chosen if top_k == 1 else chosen / chosen.sum(axis=1, keepdims=True)", "gate = chosen"))),
    W("dropped_tokens counts dropped assignments", "q3",
      swap(ROUTE_REFERENCE, ('"dropped_tokens": int((~keep.any(axis=1)).sum())', '"dropped_tokens": int((~keep).sum())'))),
    R("vectorised: one-hot queues and a cumulative sum; gates as a softmax of the chosen logits", "q3", """
def route(logits, top_k, capacity_factor):
    x = np.asarray(logits, dtype=float)
    e = x.shape[-1]
    x = x.reshape(-1, e)
    expert = np.argsort(-x, axis=1)[:, :top_k]
    top = np.take_along_axis(x, expert, axis=1)
    if top_k == 1:
        shifted = np.exp(x - x.max(axis=1, keepdims=True))
        gate = np.take_along_axis(shifted, expert, axis=1) / shifted.sum(axis=1, keepdims=True)
    else:
        w = np.exp(top - top[:, :1])
        gate = w / w.sum(axis=1, keepdims=True)
    capacity = math.ceil(capacity_factor * len(x) * top_k / e)
    onehot = np.eye(e, dtype=int)[expert.T.reshape(-1)]
    slot = ((np.cumsum(onehot, axis=0) - 1) * onehot).sum(axis=1).reshape(top_k, len(x)).T
    keep = slot < capacity
    return {"expert": expert, "gate": gate, "keep": keep, "capacity": capacity,
            "tokens_per_expert": np.bincount(expert.reshape(-1), minlength=e).tolist(),
            "kept_per_expert": [int(((expert == i) & keep).sum()) for i in range(e)],
            "dropped_tokens": int(np.sum(~np.any(keep, axis=1)))}
"""),
    R("plain Python: sorted experts per token, queues counted in a dict, lists throughout", "q3", """
def route(logits, top_k, capacity_factor):
    rows = [list(map(float, row)) for row in np.asarray(logits, dtype=float).reshape(-1, np.shape(logits)[-1])]
    tokens, n_experts = len(rows), len(rows[0])
    expert, gate = [], []
    for row in rows:
        m = max(row)
        p = [math.exp(x - m) for x in row]
        p = [x / sum(p) for x in p]
        best = sorted(range(n_experts), key=lambda i: -p[i])[:top_k]
        expert.append(best)
        chosen = [p[i] for i in best]
        gate.append(chosen if top_k == 1 else [x / sum(chosen) for x in chosen])
    capacity = math.ceil(capacity_factor * tokens * top_k / n_experts)
    queue, keep = {}, [[False] * top_k for _ in range(tokens)]
    for c in range(top_k):
        for t in range(tokens):
            e = expert[t][c]
            queue[e] = queue.get(e, 0) + 1
            keep[t][c] = queue[e] <= capacity
    routed = [sum(row.count(i) for row in expert) for i in range(n_experts)]
    kept = [sum(keep[t][c] for t in range(tokens) for c in range(top_k) if expert[t][c] == i)
            for i in range(n_experts)]
    return {"expert": expert, "gate": gate, "keep": keep, "capacity": capacity,
            "tokens_per_expert": routed, "kept_per_expert": kept,
            "dropped_tokens": sum(not any(row) for row in keep)}
"""),
    # q4: bytes per axis
    W("tensor axis: the 2 forward allreduces only", "q4", swap(_BYTES, ("4 * blocks * m * 2", "2 * blocks * m * 2"))),
    W("tensor axis: an allreduce sends its whole tensor, not 2 (N - 1)/N of it", "q4",
      swap(_BYTES, ("4 * blocks * m * 2 * (tp - 1) / tp * rows", "4 * blocks * m * rows * (tp > 1)"))),
    W("every stage counted with two boundaries", "q4",
      swap(_BYTES, ("boundaries = (stage > 0) + (stage < pp - 1)", "boundaries = 2 if pp > 1 else 0"))),
    W("sequence parallelism ignored across stage boundaries", "q4",
      swap(_BYTES, ("(rows // tp if sequence_parallel else rows)", "rows"))),
    W("context ring counted forward only", "q4", swap(_BYTES, ("(6 * (cp - 1) + 2)", "2 * (cp - 1)"))),
    W("context blocks hold every head (not divided by N_tp)", "q4",
      swap(_BYTES, ("(6 * (cp - 1) + 2) * rows // tp", "(6 * (cp - 1) + 2) * rows"))),
    W("bytes from 4 bytes per element whatever itemsize", "q4",
      swap(_BYTES, ('{"tp": tp_elements * itemsize, "pp": pp_elements * itemsize, "cp": cp_elements * itemsize}',
                    '{"tp": tp_elements * 4, "pp": pp_elements * 4, "cp": cp_elements * 4}'))),
    W("tensor and context traffic from the whole sequence, not the rank's s / N_cp tokens", "q4",
      swap(_BYTES, ("tokens, blocks = s // cp, layers // pp", "tokens, blocks = s, layers // pp"),
           ("pp_elements = boundaries * m * (rows // tp if sequence_parallel else rows)",
            "pp_elements = boundaries * m * (b * (s // cp) * h // tp if sequence_parallel else b * (s // cp) * h)"),
           ("cp_elements = blocks * m * (6 * (cp - 1) + 2) * rows // tp if cp > 1 else 0",
            "cp_elements = blocks * m * (6 * (cp - 1) + 2) * (b * (s // cp) * h) // tp if cp > 1 else 0"))),
    R("message by message: each collective's messages and sizes, summed", "q4", """
def activation_bytes(b, s, h, layers, m, tp, pp, cp, stage, itemsize=4, sequence_parallel=False):
    act = b * (s // cp) * h
    sent = {"tp": 0.0, "pp": 0, "cp": 0}
    for _ in range(layers // pp):
        for _ in range(m):
            for _ in range(4):  # two allreduces forward, two backward: reduce-scatter + all-gather, N - 1 chunks each
                sent["tp"] += 2 * (tp - 1) * (act / tp)
            if cp > 1:
                block = act // tp
                sent["cp"] += (cp - 1) * 2 * block + (cp - 1) * 4 * block + 2 * block
    crossing = act // tp if sequence_parallel else act
    if stage < pp - 1:
        sent["pp"] += m * crossing
    if stage > 0:
        sent["pp"] += m * crossing
    return {k: v * itemsize for k, v in sent.items()}
"""),
    R("exact fractions, converted at the end", "q4", """
def activation_bytes(b, s, h, layers, m, tp, pp, cp, stage, itemsize=4, sequence_parallel=False):
    from fractions import Fraction
    per_rank = Fraction(b * s * h, cp)
    tp_bytes = 8 * Fraction(layers, pp) * m * Fraction(tp - 1, tp) * per_rank * itemsize
    ends = int(stage != 0) + int(stage != pp - 1)
    pp_bytes = ends * m * (per_rank / tp if sequence_parallel else per_rank) * itemsize
    cp_bytes = (Fraction(layers, pp) * m * (6 * cp - 4) * per_rank / tp * itemsize) if cp != 1 else 0
    return {"tp": float(tp_bytes), "pp": int(pp_bytes), "cp": int(cp_bytes)}
"""),
]
