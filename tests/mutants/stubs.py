"""A stub that knows the visible answers: every solution function answers right when called with arguments the
visible tests used (recorded from the release version of the notebook, whose test cells stop at the hidden-test
marker), and otherwise returns a default of the obvious form (zeros, empty, nothing). Under partial credit it must
pass every visible check and still earn nothing.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import numpy as np

from dsgd_teach.grading.notebook import HIDDEN_BEGIN, Assignment, nbgrader_meta

from . import harness


def _z(*shape: int) -> np.ndarray:
    return np.zeros(shape)


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _rows(logits: Any) -> int:
    return int(np.prod(np.shape(logits)[:-1]))


ZEROS: dict[str, Callable[..., Any]] = {  # per function: what a stub returns for inputs it has not seen
    "minibatch_indices": lambda n, b, step, seed: np.zeros(min(b, n), dtype=int),
    "logistic_grad": lambda w, X, y: _z(len(w)),
    "sgd_step": lambda w, X, y, lr: _z(len(w)),
    "train": lambda X, y, lr, b, steps, seed: _z(X.shape[1]),
    "sparse_logistic_update": lambda w, cols, vals, label, lr: 0,
    "replay": lambda w0, events: _z(len(w0)),
    "lost_updates": lambda events: 0,
    "downpour_worker": lambda server_w, *a: (_z(len(server_w)), []),
    "push_staleness": lambda events: [],
    "backup_aggregate": lambda arrivals, n: (_z(len(arrivals[0][2])), [], []),
    "async_apply": lambda w0, updates, lr: (_z(len(w0)), []),
    "async_sgd": lambda w0, *a: (_z(len(w0)), []),
    "ring_schedule": lambda p: [],
    "ring_allreduce": lambda arrays, log=None: [_z(len(a)) for a in arrays],
    "ring_bytes_sent": lambda log, n, p, itemsize: [0] * p,
    "speedup_efficiency": lambda t, s: (_z(len(t)), _z(len(t))),
    "amdahl_fraction": lambda t, s: 0.0,
    "amdahl_speedup": lambda f, p: 0.0,
    "threads_worth_using": lambda f, e, m: 0,
    "one_f_one_b": lambda p, m, s: [],
    "peak_activations": lambda actions: 0,
    "gpipe_times": lambda tf, tb, m: (_z(len(tf), m), _z(len(tf), m)),
    "gpipe_step_time": lambda tf, tb, m: 0.0,
    "bubble": lambda tf, tb, m: _z(len(tf)),
    "partial_outputs": lambda X, A, B, n: [_z(X.shape[0], B.shape[1]) for _ in range(n)],
    "allreduce_bytes": lambda rows, d_out, n: 0,
    "decoupled_sgd": lambda w0, *a: (_z(len(w0)), []),
    "weighted_average": lambda models, counts: _z(len(models[0])),
    "local_sgd_round": lambda w, *a: _z(len(w)),
    "fedavg_bytes": lambda *a: 0,
    "one_bit": lambda v: _z(len(v)),
    "error_feedback": lambda grads, feedback=True: ([_z(len(g)) for g in grads], _z(len(grads[0]))),
    "fifo_port": lambda arrivals, *a: _z(len(arrivals)),
    "server_allreduce_s": lambda *a: 0.0,
    "async_staleness": lambda durations, n: [],
    "ring_allreduce_rank": lambda comm, x: x.new_zeros(x.shape),
    "log_bytes": lambda log: (0, 0),
    "busiest_link": lambda logs: None,
    "assign_buckets": lambda params, cap, itemsize=4: [],
    "bucket_finish_times": lambda buckets, *a: [0.0] * len(buckets),
    "shard": lambda x, n, r: _z(_ceil(len(x), n)),
    "zero_adam_step": lambda w, grads, states, *a, **k: (
        _z(len(w)), [{"step": 0, "m": _z(_ceil(len(w), len(grads))), "v": _z(_ceil(len(w), len(grads)))}
                     for _ in grads]),
    "rank_bytes": lambda units, n, stage, precision="mixed": {"params": 0, "grads": 0, "optimizer": 0, "total": 0},
    "elements_sent": lambda units, n, stage: 0,
    "smallest_world": lambda *a, **k: 0,
    "block_attention": lambda q, k, v, mask=None: (_z(len(q), np.shape(v)[1]), _z(len(q))),
    "merge": lambda o1, l1, o2, l2: (_z(*np.shape(o1)), _z(len(l1))),
    "mesh_rank": lambda sizes, coords: 0,
    "axis_groups": lambda sizes, axis: [],
    "route": lambda logits, top_k, capacity_factor: {
        "expert": np.zeros((_rows(logits), top_k), dtype=int), "gate": _z(_rows(logits), top_k),
        "keep": np.zeros((_rows(logits), top_k), dtype=bool), "capacity": 0,
        "tokens_per_expert": [0] * np.shape(logits)[-1], "kept_per_expert": [0] * np.shape(logits)[-1],
        "dropped_tokens": 0},
    "activation_bytes": lambda *a, **k: {"tp": 0, "pp": 0, "cp": 0},
}
FAMILIES = {"zeros": ZEROS, "none": None}  # "none": every unseen call returns None and changes nothing


def fingerprint(value: Any, depth: int = 0) -> Any:
    """A hashable summary of an argument: equal for equal inputs (arrays by dtype, shape and bytes)."""
    if depth > 12:
        return "..."
    if isinstance(value, np.ndarray):
        return ("nd", value.dtype.str, value.shape, value.tobytes())
    if type(value).__name__ == "Tensor":
        return ("tensor", fingerprint(value.detach().cpu().numpy(), depth + 1))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(fingerprint(v, depth + 1) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple(sorted((repr(k), fingerprint(v, depth + 1)) for k, v in value.items())))
    if value is None or isinstance(value, (bool, int, float, str, np.number)):
        return (type(value).__name__, value)
    if callable(value):
        return ("fn", getattr(value, "__qualname__", type(value).__name__))
    return (type(value).__name__, getattr(value, "rank", None), getattr(value, "world", None))


class Stub:
    """Wraps solution functions: right answers for the visible tests' arguments, `family`'s defaults otherwise."""

    def __init__(self, family: str) -> None:
        self.defaults, self.seen, self.recording = FAMILIES[family], set(), True

    def wrap(self, name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        """The stub of one solution function."""
        sig = inspect.signature(real)

        @functools.wraps(real)
        def stub(*args: Any, **kwargs: Any) -> Any:
            bound = sig.bind(*args, **kwargs)
            bound.apply_defaults()
            key = (name, fingerprint(tuple(bound.arguments.items())))
            if self.recording:
                self.seen.add(key)
            if self.recording or key in self.seen:
                return real(*args, **kwargs)
            return None if self.defaults is None else self.defaults[name](*args, **kwargs)

        return stub


def plan(a: Assignment, visible_only: bool) -> list[tuple[str, str | None]]:
    """The notebook's cells with every solution function stubbed after its definition; test cells rewritten as the
    grader rewrites them, cut at the hidden-test marker when `visible_only` (what a student sees)."""
    tests = {q.grade_id for q in a.questions}
    out: list[tuple[str, str | None]] = []
    for cell in a.notebook.cells:
        if cell.cell_type != "code":
            continue
        meta = nbgrader_meta(cell)
        gid = str(meta.get("grade_id", ""))
        if gid in tests:
            source = cell.source.split(HIDDEN_BEGIN)[0] if visible_only else cell.source
            out.append((harness._rewritten(source, "student"), gid))
        elif meta.get("solution"):
            names = sorted(harness._defined(cell.source))
            out.append((cell.source + "\n" + "".join(f"\n{n} = _dsgd_stub.wrap({n!r}, {n})" for n in names), None))
        else:
            out.append((cell.source, None))
    return out


def run_stub(a: Assignment, family: str, seed: int) -> dict[str, Any]:
    """The report of the stub at a seed: the visible arguments recorded first, then the full test cells."""
    stub = Stub(family)
    harness.run(a, "student", seed, plan=plan(a, True), extra={"_dsgd_stub": stub})
    stub.recording = False
    return harness.run(a, "student", seed, plan=plan(a, False), extra={"_dsgd_stub": stub})
