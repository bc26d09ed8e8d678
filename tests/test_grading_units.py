"""Unit tests of the grader's pieces that need no kernel: values, checks, cell rewriting, rebuilding, verdicts."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
import numpy as np
import pytest

from dsgd_teach.grading import cli
from dsgd_teach.grading.checks import check
from dsgd_teach.grading.notebook import load_assignment, rebuild, rewrite_test, source_cells
from dsgd_teach.grading.release import _verify
from dsgd_teach.grading.values import encode, same
from dsgd_teach.grading.verdict import grade

SOURCE = Path(__file__).resolve().parents[1] / "course" / "assignments" / "source"
PS01 = SOURCE / "ps01_sgd" / "ps01_sgd.ipynb"


def test_encode_and_same_agree_with_numpy_semantics():
    assert same(encode([1, 2, 3]), encode(np.array([1.0, 2.0, 3.0])))
    assert not same(encode(np.zeros((2, 2))), encode(np.zeros(4)))
    assert same(encode(0.1 + 0.2), encode(0.3), atol=1e-12)
    assert not same(encode(0.1 + 0.2), encode(0.3))
    assert not same(encode(float("nan")), encode(float("nan")))
    assert same(encode([(0, 1, 2), (1, 0, 1)]), encode([[0, 1, 2], [1, 0, 1]]))
    assert not same(encode(True), encode(1.0))
    assert same(encode({"b": [1, 2], "a": "x"}), encode({"a": "x", "b": np.array([1, 2])}))
    with pytest.raises(TypeError):
        encode(object())


def test_check_message_names_expected_got_and_hint():
    check("fine", [1, 2], np.array([1, 2]))
    with pytest.raises(AssertionError) as err:
        check("my label", np.zeros(3), [0, 0, 1], hint="look at the last entry")
    text = str(err.value)
    assert "my label" in text and "expected" in text and "got" in text and "look at the last entry" in text
    with pytest.raises(AssertionError, match="shape"):
        check("shape", np.zeros((2, 2)), np.zeros(4))


TEST_CELL = textwrap.dedent('''\
    x = 3
    check("visible", f(x), 6, hint="double it")
    ### BEGIN HIDDEN TESTS
    def _ref_f(v):
        return 2 * v
    for k in range(2):
        _ref_value = _ref_f(k)
        _ref_value += 0
        check(f"hidden {k}", f(k), _ref_value, atol=1e-9)
    ### END HIDDEN TESTS
''')


def test_student_rewrite_strips_expected_values_and_oracles():
    code = rewrite_test(TEST_CELL, "student")
    assert "_ref" not in code and "6" not in code.replace("_dsgd", "") and "check(" not in code
    assert code.count("_dsgd_record(") == 2
    ns: dict = {"f": lambda v: 2 * v, "_dsgd_record": lambda label, got: seen.append((label, got))}
    seen: list = []
    exec(code, ns)
    assert seen == [("visible", 6), ("hidden 0", 0), ("hidden 1", 2)]


def test_reference_rewrite_reports_expected_values_and_marks_hidden_checks():
    code = rewrite_test(TEST_CELL, "reference")
    seen: list = []

    def reference(label, got, expect, **kw):
        seen.append((label, expect, kw.get("hidden")))

    exec(code, {"f": lambda v: 2 * v, "_dsgd_reference": reference})
    assert seen == [("visible", 6, False), ("hidden 0", 0, True), ("hidden 1", 2, True)]


def _with_cell(nb, grade_id: str, source: str):
    for cell in nb.cells:
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") == grade_id:
            cell.source = source
    return nb


def test_rebuild_restores_edited_and_deleted_tests_and_keeps_student_cells():
    assignment = load_assignment(PS01)
    nb = nbformat.read(str(PS01), as_version=4)
    nb = _with_cell(nb, "ps01_sgd_q1_tests", "pass  # edited")
    nb.cells = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") != "ps01_sgd_q3_tests"]
    fake = nbformat.v4.new_code_cell("print('a fake test')")
    fake.metadata["nbgrader"] = {"grade": True, "grade_id": "made_up", "points": 100}
    nb.cells.append(fake)
    cells = rebuild(assignment, nb)
    tests = {c["grade_id"]: c["source"] for c in cells if "grade_id" in c}
    assert set(tests) == {q.grade_id for q in assignment.questions}
    assert "edited" not in tests["ps01_sgd_q1_tests"] and "BEGIN HIDDEN TESTS" in tests["ps01_sgd_q1_tests"]
    assert any(c["source"] == "print('a fake test')" and "grade_id" not in c for c in cells)
    assert len(source_cells(assignment)) == sum(c.cell_type == "code" for c in assignment.notebook.cells)


def _records(*pairs, hidden=False):
    return [{"label": label, "value": encode(v), "rtol": 0.0, "atol": 1e-9, "hidden": hidden, "hint": "h",
             "solution_ok": True} for label, v in pairs]


def test_verdict_compares_values_outside_the_kernel():
    assignment = load_assignment(PS01)
    ids = [q.grade_id for q in assignment.questions]
    reference = {"tests": {ids[0]: {"status": "ok", "records": _records(("a", 1.0), ("b", [1, 2]))},
                           ids[1]: {"status": "ok", "records": _records(("c", 3.0), hidden=True)},
                           ids[2]: {"status": "ok", "records": _records(("d", 4.0))}}}
    student = {"tests": {
        ids[0]: {"status": "ok", "error": "", "records": [{"label": "a", "value": encode(1.0)},
                                                           {"label": "b", "value": encode([1, 3])}]},
        ids[1]: {"status": "ok", "error": "", "records": [{"label": "c", "value": encode(5.0)}]},
        ids[2]: {"status": "error", "error": "ValueError: boom", "records": []},
    }, "flags": ["open '/secret'"]}
    grades = {g.question: g for g in grade(assignment, reference, student)}
    assert grades[ids[0]].points == 0 and "expected" in grades[ids[0]].reason and "hint: h" in grades[ids[0]].reason
    assert grades[ids[1]].points == 0 and grades[ids[1]].reason.startswith("hidden check 'c' failed: expected a")
    assert "5" not in grades[ids[1]].reason
    assert grades[ids[2]].points == 0 and "ValueError: boom" in grades[ids[2]].reason
    assert grades["(integrity)"].reason.startswith("FLAGGED")
    ok = {"tests": {gid: {"status": "ok", "error": "", "records": [{"label": r["label"], "value": r["value"]}
                                                                    for r in reference["tests"][gid]["records"]]}
                    for gid in ids}}
    assert all(g.points == g.max_points for g in grade(assignment, reference, ok))
    forged = {"tests": {**ok["tests"], ids[2]: {"status": "ok", "error": "", "records":
                                                 ok["tests"][ids[2]]["records"] * 2}}}
    assert {g.question: g.points for g in grade(assignment, reference, forged)}[ids[2]] == 0


SANDBOX_PROBE = textwrap.dedent('''\
    import gc, json, os, subprocess, sys, tempfile
    import numpy  # warmed before the fence, as dsgd_teach.grading.kernel does (numpy loads native code via ctypes)
    from dsgd_teach.grading import sandbox
    work = tempfile.mkdtemp()
    secret = sys.argv[1]
    sandbox.install(work, sandbox.default_read_roots(), [os.path.dirname(secret)])
    results = {}
    def attempt(name, fn):
        try:
            fn()
            results[name] = "allowed"
        except PermissionError:
            results[name] = "denied"
    attempt("read_secret", lambda: open(secret).read())
    attempt("read_secret_relative", lambda: (os.chdir(os.path.dirname(secret)), open(os.path.basename(secret))))
    attempt("list_secret_dir", lambda: os.listdir(os.path.dirname(secret)))
    attempt("subprocess", lambda: subprocess.run(["true"]))
    attempt("gc_walk", lambda: gc.get_objects())
    attempt("kill_parent", lambda: os.kill(os.getppid(), 0))
    attempt("write_outside", lambda: open(os.path.join(os.path.dirname(secret), "x"), "w"))
    attempt("write_inside", lambda: open(os.path.join(work, "x"), "w").close())
    attempt("read_numpy", lambda: open(os.path.join(os.path.dirname(__import__("numpy").__file__), "__init__.py")).read())
    print(json.dumps(results))
''')


def test_sandbox_hook_denies_reading_sources_processes_and_gc(tmp_path):
    secret = tmp_path / "private" / "hidden.ipynb"
    secret.parent.mkdir()
    secret.write_text("solutions")
    script = tmp_path / "probe.py"
    script.write_text(SANDBOX_PROBE)
    out = subprocess.run([sys.executable, str(script), str(secret)], capture_output=True, text=True, timeout=120)
    results = json.loads(out.stdout.strip().splitlines()[-1])
    assert results == {"read_secret": "denied", "read_secret_relative": "denied", "list_secret_dir": "denied",
                       "subprocess": "denied", "gc_walk": "denied", "kill_parent": "denied",
                       "write_outside": "denied", "write_inside": "allowed", "read_numpy": "allowed"}
    assert "DSGD-SANDBOX-DENIED" in out.stderr


def test_release_verification_refuses_solutions(tmp_path):
    leaked = tmp_path / "x.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("### BEGIN SOLUTION\nx = 1")]),
                   str(leaked))
    with pytest.raises(RuntimeError, match="BEGIN SOLUTION"):
        _verify(leaked)


def test_cli_rejects_missing_folders(tmp_path, capsys):
    assert cli.main([str(tmp_path / "nope")]) == 2
    assert cli.main([str(tmp_path), "--source", str(tmp_path / "none")]) == 2
    assert "error" in capsys.readouterr().err


@pytest.mark.parametrize("name", sorted(p.name for p in SOURCE.iterdir() if p.is_dir()))
def test_each_solution_matches_its_oracles_in_both_rewrites(name, monkeypatch):
    """In-process dry run of grading: the student-mode rewrite of the solution reports the reference values."""
    from dsgd_teach.grading.notebook import find_assignments

    monkeypatch.setenv("DSGD_GRADER_SEED", "987654")
    assignment = load_assignment(find_assignments(SOURCE)[name])
    reports = {}
    for mode in ("student", "reference"):
        seen: list = []
        ns: dict = {"_dsgd_record": lambda label, got, seen=seen: seen.append((label, encode(got))),
                    "_dsgd_reference": lambda label, got, expect, seen=seen, **kw: seen.append((label, encode(expect)))}
        for cell in source_cells(assignment):
            exec(rewrite_test(cell["source"], mode) if "grade_id" in cell else cell["source"], ns)
        reports[mode] = seen
    assert [lab for lab, _ in reports["student"]] == [lab for lab, _ in reports["reference"]]
    assert len(reports["student"]) >= 6
    for (label, got), (_, expected) in zip(reports["student"], reports["reference"], strict=True):
        assert same(got, expected, 1e-9, 1e-9), label
