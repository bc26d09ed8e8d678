"""Boundary mutants for ps09-ps12 (issue 45): one wrong solution per applicable boundary class and question, each
caught by a fixed hidden case at every seed. `COVERAGE` names, per question and class, the mutant (new here or
already in the catalog) or why the class does not apply."""

from __future__ import annotations

from .harness import W

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
