"""Boundary mutants for ps09-ps13 (issue 45): one wrong solution per applicable boundary class and question, each
caught by a fixed hidden case at every seed. `COVERAGE` names, per question and class, the mutant (new here or
already in the catalog) or why the class does not apply."""

from __future__ import annotations

from .harness import W, swap
from .ps13_transformer import BLOCK_REFERENCE, ROUTE_REFERENCE

PS09 = [
    W("[dtype] one_bit decodes into np.empty_like(v): integer input truncated", "q1", """
def one_bit(v):
    v = np.asarray(v)
    ones = v >= 0
    out = np.empty_like(v)
    if ones.any():
        out[ones] = v[ones].mean()
    if (~ones).any():
        out[~ones] = v[~ones].mean()
    return out
"""),
    W("[dtype] residual kept in np.zeros_like(grads[0]): integer gradients truncate it", "q2", """
def error_feedback(grads, feedback=True):
    residual = np.zeros_like(np.asarray(grads[0]))
    sent = []
    for g in grads:
        target = g + residual if feedback else np.asarray(g, dtype=float)
        q = one_bit(target)
        sent.append(q)
        if feedback:
            residual[:] = target - q
    return sent, residual
"""),
]

COVERAGE = {
    "ps09_onebit": {
        "q1": {"order": "n/a: elementwise, no order in the output",
               "dtype": "[dtype] one_bit decodes into np.empty_like(v): integer input truncated",
               "itemsize": "n/a: no byte counts", "limit": "n/a: no search or range",
               "edge": "zero counted as negative"},
        "q2": {"order": "n/a: messages in step order, checked one by one",
               "dtype": "[dtype] residual kept in np.zeros_like(grads[0]): integer gradients truncate it",
               "itemsize": "n/a: no byte counts", "limit": "n/a: no search or range",
               "edge": "residual kept from the gradient alone (e = g - q)"},
    },
}

PS10 = [
    W("[dtype] port: delivery times in np.zeros_like(arrivals): integer arrivals truncate them", "q1", """
def fifo_port(arrivals, nbytes, alpha_s, bandwidth_Bps):
    arrivals = np.asarray(arrivals)
    done, free = np.zeros_like(arrivals), 0.0
    for j in sorted(range(len(arrivals)), key=lambda j: (arrivals[j], j)):
        hold = alpha_s + (nbytes[j] / bandwidth_Bps if bandwidth_Bps else 0.0)
        free = done[j] = max(free, arrivals[j]) + hold
    return done
"""),
    W("[limit] staleness: a worker never runs out (its durations wrap around)", "q2", """
import heapq

def async_staleness(durations, n_updates):
    durations = np.asarray(durations, dtype=float)
    heap = [(durations[i, 0], i, 0, 0) for i in range(len(durations))]
    heapq.heapify(heap)
    out = []
    while heap and len(out) < n_updates:
        t, i, k, read = heapq.heappop(heap)
        out.append((i, len(out) - read))
        heapq.heappush(heap, (t + durations[i, (k + 1) % durations.shape[1]], i, k + 1, len(out)))
    return out
"""),
]

PS11 = [
    W("[itemsize] log_bytes from 8 bytes per element", "q2", """
def log_bytes(log):
    return (sum(8 * m["elements"] for m in log if m["direction"] == "send"),
            sum(8 * m["elements"] for m in log if m["direction"] == "recv"))
"""),
    W("[itemsize] busiest link from 8 bytes per element", "q2", """
def busiest_link(logs):
    load = {}
    for log in logs:
        for m in log:
            if m["direction"] == "send":
                load[(m["src"], m["dst"])] = load.get((m["src"], m["dst"]), 0) + 8 * m["elements"]
    return min(load, key=lambda pair: (-load[pair], pair)) if load else None
"""),
]

COVERAGE.update({
    "ps10_sim": {
        "q1": {"order": "port: delivery times in service order, not indexed like the inputs",
               "dtype": "[dtype] port: delivery times in np.zeros_like(arrivals): integer arrivals truncate them",
               "itemsize": "n/a: message sizes are given in bytes", "limit": "n/a: no search or range",
               "edge": "server: replies start at the last ready time, not the last delivery"},
        "q2": {"order": "staleness: simultaneous finishes in the order the workers were rescheduled",
               "dtype": "n/a: durations only add up and compare (integers give the same order)",
               "itemsize": "n/a: no byte counts",
               "limit": "[limit] staleness: a worker never runs out (its durations wrap around)",
               "edge": "staleness counted the papers' way (one more)"},
    },
    "ps11_ring_comm": {
        "q1": {"order": "Comm ring: sends to the left neighbour, receives from the right",
               "dtype": "Comm ring: receive buffers in torch's default float32",
               "itemsize": "n/a: Comm logs the bytes; float64 tensors by the question's text",
               "limit": "n/a: no search or range",
               "edge": "Comm ring: torch.chunk's ceil-sized chunks, not np.array_split's"},
        "q2": {"order": "busiest link: recv records counted too (each message twice)",
               "dtype": "n/a: byte counts are integers",
               "itemsize": "[itemsize] busiest link from 8 bytes per element",
               "limit": "n/a: no search or range", "edge": "busiest link: the most messages, not the most bytes"},
    },
})

PS12 = [
    W("[dtype] the new w gathered into np.zeros_like(w): integer parameters truncated", "q2", """
def zero_adam_step(w, grads, states, lr, betas=(0.9, 0.999), eps=1e-8):
    n, (b1, b2) = len(grads), betas
    size = -(-len(w) // n)
    new_w, new_states = np.zeros_like(w), []
    for r, state in enumerate(states):
        g = sum(shard(gk, n, r) for gk in grads) / n
        t = state["step"] + 1
        m = b1 * state["m"] + (1 - b1) * g
        v = b2 * state["v"] + (1 - b2) * g * g
        upd = shard(w, n, r) - lr * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps)
        k = max(0, min(len(w), (r + 1) * size) - r * size)
        new_w[r * size:r * size + k] = upd[:k]
        new_states.append({"step": t, "m": m, "v": v})
    return new_w, new_states
"""),
    W("[limit] smallest_world never tries max_n itself", "q3", """
def smallest_world(units, stage, budget_bytes, precision="mixed", max_n=1024):
    for n in range(1, max_n):
        if rank_bytes(units, n, stage, precision)["total"] <= budget_bytes:
            return n
    return None
"""),
]

COVERAGE["ps12_sharding"] = {
    "q1": {"order": "buckets filled in registration order, not reverse", "dtype": "n/a: sizes are integers",
           "itemsize": "bucket sizes counted in elements, itemsize ignored",
           "limit": "a bucket is closed only once it holds more than the cap (off by one)",
           "edge": "a parameter that would overflow the bucket opens a new one (buckets never exceed the cap)"},
    "q2": {"order": "shards as np.array_split: the remainder on the first ranks",
           "dtype": "[dtype] the new w gathered into np.zeros_like(w): integer parameters truncated",
           "itemsize": "n/a: no byte counts", "limit": "n/a: no search or range",
           "edge": "bias correction with the steps taken before this one"},
    "q3": {"order": "n/a: dicts and counts, no list order",
           "dtype": "n/a: element counts are integers",
           "itemsize": "12 bytes of optimizer state in fp32 too",
           "limit": "[limit] smallest_world never tries max_n itself",
           "edge": "no N fits: returns max_n instead of None"},
}

PS13 = [
    W("[dtype] block attention writes o into np.zeros_like(v): integer values truncated", "q1",
      swap(BLOCK_REFERENCE, ("    q, k, v = (np.asarray(x, dtype=float) for x in (q, k, v))\n    scores = q @ k.T / np.sqrt(q.shape[1])",
                    "    scores = np.asarray(q) @ np.asarray(k).T / np.sqrt(np.shape(q)[1])"),
           ("    o = np.where(total > 0, weights @ v / np.where(total > 0, total, 1.0), 0.0)",
            "    o = np.zeros((len(scores), np.shape(v)[1]), dtype=np.asarray(v).dtype)\n"
            "    o[:] = np.where(total > 0, weights @ v / np.where(total > 0, total, 1.0), 0.0)"))),
    W("[dtype] gates kept in an array of the logits' dtype: integer logits truncate them", "q3",
      swap(ROUTE_REFERENCE, ("    logits = np.asarray(logits, dtype=float)", "    logits = np.asarray(logits)"),
           ("    gate = chosen if top_k == 1 else chosen / chosen.sum(axis=1, keepdims=True)",
            "    gate = np.zeros_like(flat[:, :top_k])\n"
            "    gate[:] = chosen if top_k == 1 else chosen / chosen.sum(axis=1, keepdims=True)"))),
]

COVERAGE["ps13_transformer"] = {
    "q1": {"order": "n/a: the merge is symmetric in its two blocks, and the rows keep the queries' order",
           "dtype": "[dtype] block attention writes o into np.zeros_like(v): integer values truncated",
           "itemsize": "n/a: no byte counts",
           "limit": "block attention without subtracting the row's largest score (overflows)",
           "edge": "merge as l1 + log1p(exp(l2 - l1)): fails when the first block is masked"},
    "q2": {"order": "axes read the wrong way round: tensor outermost, pipeline fastest",
           "dtype": "n/a: sizes, coordinates and ranks are integers", "itemsize": "n/a: no byte counts",
           "limit": "an axis of size 1 has no groups",
           "edge": "every axis's groups strided by N / size (right for the outermost axis only)"},
    "q3": {"order": "slots claimed token by token (each token's choices together), not first choices first",
           "dtype": "[dtype] gates kept in an array of the logits' dtype: integer logits truncate them",
           "itemsize": "n/a: no byte counts",
           "limit": "an expert keeps capacity + 1 assignments (off by one)",
           "edge": "capacity counted per sequence: each sequence routed as its own group"},
    "q4": {"order": "n/a: a dict of three sums", "dtype": "n/a: sizes are integers",
           "itemsize": "bytes from 4 bytes per element whatever itemsize",
           "limit": "every stage counted with two boundaries",
           "edge": "sequence parallelism ignored across stage boundaries"},
}
