"""The similarity report: copied-and-renamed solutions rank above every pair of independent honest ones."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import nbformat
import numpy as np
import pytest

from dsgd_teach.grading import similarity
from dsgd_teach.grading.notebook import load_assignment, nbgrader_meta

SOURCE = Path(__file__).resolve().parents[1] / "course" / "assignments" / "source"
PS01 = SOURCE / "ps01_sgd" / "ps01_sgd.ipynb"
Q1, Q2 = "ps01_sgd_q1_solution", "ps01_sgd_q2_solution"
SIG1 = '''def minibatch_indices(n, batch_size, step, seed):
    """Row indices of the minibatch used at `step`: positions [step*b, (step+1)*b) of the epoch permutations."""
'''
SIG2 = ('def logistic_grad(w, X, y):\n    """Gradient of the mean logistic loss at w on the rows (X, y)."""\n{grad}\n\n'
        'def sgd_step(w, X, y, lr):\n'
        '    """A new parameter vector after one gradient step on (X, y); w itself is not modified."""\n{step}\n')

# Honest students: each writes minibatch_indices and logistic_grad / sgd_step a way of their own (all correct:
# test_honest_alternatives_are_correct checks them against the reference solution).
HONEST_Q1 = {
    "ana": '''    if batch_size >= n:
        return np.arange(n)
    start = step * batch_size
    stop = start + batch_size
    first, last = start // n, (stop - 1) // n
    perms = [np.random.default_rng([seed, e]).permutation(n) for e in range(first, last + 1)]
    return np.concatenate(perms)[start - first * n:stop - first * n]''',
    "ben": '''    if batch_size >= n:
        return np.arange(n)
    out = []
    for position in range(step * batch_size, (step + 1) * batch_size):
        epoch, i = divmod(position, n)  # which pass over the data, and where in it
        out.append(np.random.default_rng([seed, epoch]).permutation(n)[i])
    return np.array(out)''',
    "cleo": '''    if batch_size >= n:
        return np.arange(n)
    cache = {}

    def perm(e):
        if e not in cache:
            cache[e] = np.random.default_rng([seed, e]).permutation(n)
        return cache[e]

    positions = np.arange(step * batch_size, (step + 1) * batch_size)
    return np.array([perm(p // n)[p % n] for p in positions])''',
    "dev": '''    if n <= batch_size:
        return np.arange(n)
    lo = step * batch_size
    hi = lo + batch_size
    e0, e1 = lo // n, -(-hi // n)
    stream = np.hstack([np.random.default_rng([seed, e]).permutation(n) for e in range(e0, e1)])
    return stream[lo - e0 * n:hi - e0 * n]''',
    "eli": '''    if batch_size >= n:
        return np.arange(n)
    pos, remaining, parts = step * batch_size, batch_size, []
    while remaining:
        epoch, offset = divmod(pos, n)
        take = min(remaining, n - offset)
        parts.append(np.random.default_rng([seed, epoch]).permutation(n)[offset:offset + take])
        pos, remaining = pos + take, remaining - take
    return np.concatenate(parts)''',
}
HONEST_Q2 = {
    "ana": ('''    z = X.dot(w)
    sig = 1 / (1 + np.exp(-z))
    return X.T.dot(sig - y) / X.shape[0]''', '''    g = logistic_grad(w, X, y)
    return w - lr * g'''),
    "ben": ('''    from scipy.special import expit
    residual = expit(X @ w) - y
    return (residual[:, None] * X).mean(axis=0)''', '''    new = w.copy()
    new -= lr * logistic_grad(w, X, y)
    return new'''),
    "cleo": ('''    grad = np.zeros(X.shape[1])
    for xi, yi in zip(X, y):
        grad += (1.0 / (1.0 + np.exp(-(xi @ w))) - yi) * xi
    return grad / len(y)''', '''    return np.subtract(w, lr * logistic_grad(w, X, y))'''),
    "dev": ('''    p = np.reciprocal(1.0 + np.exp(-np.einsum("ij,j->i", X, w)))
    return np.einsum("ij,i->j", X, p - y) / len(y)''', '''    step = lr * logistic_grad(w, X, y)
    return w - step'''),
    "eli": ('''    p = 1.0 / (1.0 + np.exp(-(X @ w)))
    return X.T @ (p - y) / len(y)''', '''    return w - lr * logistic_grad(w, X, y)'''),
}
# Copiers take a classmate's cells, rename every variable and rewrite the comments.
RENAMES = {"cleo": {"cache": "memo", "perm": "epoch_order", "positions": "where", "grad": "total", "xi": "row",
                    "yi": "label"},
           "dev": {"lo": "begin", "hi": "end", "e0": "epoch_a", "e1": "epoch_b", "stream": "joined", "step": "stp"}}
COPIES = {"cleo": "zoe", "dev": "yann"}


def _rename(code: str, names: dict[str, str]) -> str:
    code = re.sub(r"#.*", "# my own idea", code)
    return re.sub(r"\b(" + "|".join(map(re.escape, names)) + r")\b", lambda m: names[m.group(1)], code)


def _solutions(student: str) -> tuple[str, str]:
    source = next((s for s, c in COPIES.items() if c == student), student)
    q1 = SIG1 + "    # pick this step's rows\n" + HONEST_Q1[source]
    q2 = SIG2.format(grad=HONEST_Q2[source][0], step=HONEST_Q2[source][1])
    if student != source:
        q1, q2 = (_rename(q, RENAMES[source]) for q in (q1, q2))
        q1 = q1.replace("# pick this step's rows", "# choose the rows of this minibatch")
    return q1, q2


def _write_class(root: Path) -> list[str]:
    students = list(HONEST_Q1) + list(COPIES.values())
    for student in students:
        nb = nbformat.read(str(PS01), as_version=4)
        q1, q2 = _solutions(student)
        for cell in nb.cells:
            gid = nbgrader_meta(cell).get("grade_id")
            cell.source = {Q1: q1, Q2: q2}.get(gid, cell.source)
        (root / student).mkdir(parents=True)
        nbformat.write(nb, str(root / student / "ps01_sgd.ipynb"))
    return students


def test_honest_alternatives_are_correct():
    """Every honest solution returns what the reference solution returns."""
    ns_ref: dict = {"np": np}
    exec(_solutions("eli")[0] + "\n" + _solutions("eli")[1], ns_ref)
    rng = np.random.default_rng(0)
    X, y, w = rng.normal(size=(7, 3)), rng.integers(0, 2, 7).astype(float), rng.normal(size=3)
    for student in list(HONEST_Q1) + list(COPIES.values()):
        ns: dict = {"np": np}
        exec(_solutions(student)[0] + "\n" + _solutions(student)[1], ns)
        for n, b, step in [(7, 3, 0), (7, 3, 2), (7, 3, 5), (5, 8, 1), (10, 4, 7)]:
            assert np.array_equal(ns["minibatch_indices"](n, b, step, 3), ns_ref["minibatch_indices"](n, b, step, 3))
        np.testing.assert_allclose(ns["logistic_grad"](w, X, y), ns_ref["logistic_grad"](w, X, y), rtol=1e-12)
        np.testing.assert_allclose(ns["sgd_step"](w, X, y, 0.1), ns_ref["sgd_step"](w, X, y, 0.1), rtol=1e-12)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    root = tmp_path_factory.mktemp("similarity")
    _write_class(root / "subs")
    (root / "subs" / "mallory").mkdir()  # hostile input: a parse bomb's little sister and a link to the sources
    (root / "subs" / "mallory" / "ps01_sgd.ipynb").write_text('{"cells": ' + "[" * 500 + "]" * 500 + "}")
    (root / "subs" / "eve").mkdir()
    (root / "subs" / "eve" / "ps01_sgd.ipynb").symlink_to(PS01)
    assert similarity.main([str(root / "subs"), "--source", str(SOURCE), "--out", str(root / "out"),
                            "--top", "100"]) == 0
    with open(root / "out" / similarity.CSV_FILE, newline="") as f:
        return list(csv.DictReader(f)), (root / "out" / similarity.HTML_FILE).read_text()


@pytest.mark.parametrize("question", [Q1, Q2])
def test_copies_rank_above_every_independent_pair(report, question):
    rows, _ = report
    ranked = [r for r in rows if r["question"] == question]
    copied = {frozenset(p) for p in COPIES.items()}
    assert len(ranked) == 21  # 7 students, every pair
    top = {frozenset((r["student_a"], r["student_b"])) for r in ranked[:2]}
    assert top == copied, ranked[:4]
    worst_copy = min(float(r["similarity"]) for r in ranked[:2])
    best_honest = max(float(r["similarity"]) for r in ranked[2:])
    assert worst_copy > best_honest
    assert worst_copy >= 0.9


def test_unreadable_and_linked_notebooks_are_listed_not_compared(report):
    rows, page = report
    assert not {"mallory", "eve"} & ({r["student_a"] for r in rows} | {r["student_b"] for r in rows})
    assert "mallory (ps01_sgd): not compared" in page and "nested more than 100 levels" in page
    assert "eve: not compared" in page and "symlink" in page


def test_released_template_is_excluded(tmp_path):
    """Two students who leave the template as released share nothing; the template of a cell is nbgrader's stub."""
    a = load_assignment(PS01)
    templates = similarity.solution_templates(a)
    assert set(templates) == {Q1, Q2, "ps01_sgd_q3_solution"}
    assert "### BEGIN SOLUTION" not in templates[Q1] and "    raise NotImplementedError()" in templates[Q1]
    pairs = similarity.compare_question("ps01_sgd", Q2, templates[Q2], {"s1": templates[Q2], "s2": templates[Q2]})
    assert [p.similarity for p in pairs] == [0.0]
    # the same template code with one honest solution each: what they share is the template only
    own = {s: SIG2.format(grad=HONEST_Q2[s][0], step=HONEST_Q2[s][1]) for s in ("ben", "dev")}
    [pair] = similarity.compare_question("ps01_sgd", Q2, templates[Q2], own)
    assert pair.similarity < 0.35


def test_html_escapes_hostile_names_and_code(tmp_path):
    """A student's folder name and code reach the HTML escaped."""
    code = SIG1 + "    x = '<script>alert(1)</script>'\n" + HONEST_Q1["ana"]
    pairs = similarity.compare_question("ps01_sgd", Q1, "", {"<img src=x onerror=alert(1)>": code, "b": code})
    page = similarity.report_html(pairs, [], 5)
    assert "<script>" not in page and "<img" not in page
    assert "&lt;script&gt;" in page and "<mark>" in page
