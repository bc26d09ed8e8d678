"""The graded assignments tell right from wrong at every hidden-input seed.

For every assignment, realistic wrong solutions (one mistake each) must lose points and correct solutions written
differently from the reference must score full marks, at each of SEEDS hidden-input seeds, graded in-process by the
real verdict pipeline (notebook.rewrite_test + verdict.grade). The per-assignment mutation table is printed at the
end of the session.
"""

from __future__ import annotations

import re
import time

import pytest
from mutants import boundary, harness
from mutants.catalog import CATALOG

SEEDS = range(50)
_TABLE: dict[str, tuple[int, int, int, int, float]] = {}


@pytest.fixture(scope="module", autouse=True)
def _mutation_table(request):
    yield
    if not _TABLE:
        return
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    lines = [f"mutation suite over {len(SEEDS)} hidden-input seeds (in-process verdicts)",
             f"{'assignment':<22}{'wrong caught':>14}{'alternatives passed':>22}{'seconds':>9}"]
    for name, (caught, wrong, passed, right, secs) in sorted(_TABLE.items()):
        lines.append(f"{name:<22}{f'{caught}/{wrong}':>14}{f'{passed}/{right}':>22}{secs:>9.1f}")
    if reporter is None or capture is None:  # pragma: no cover - without pytest's terminal or capture plugins
        print("\n".join(lines))
        return
    with capture.global_and_fixture_disabled():  # shown with or without -s
        reporter.write_line("")
        reporter.write_sep("-", "mutation table")
        for line in lines:
            reporter.write_line(line)


def test_catalog_covers_every_question():
    """At least 6 wrong solutions (one per question at least) and 2 correct alternatives per assignment."""
    sources = {name for name in harness.default_source_dir().iterdir() if (name / f"{name.name}.ipynb").is_file()}
    assert {p.name for p in sources} == set(CATALOG), "every assignment needs a mutant catalog"
    for name, variants in CATALOG.items():
        a = harness.assignment(name)
        questions = {q.grade_id.removeprefix(f"{name}_").removesuffix("_tests") for q in a.questions}
        wrong = [v for v in variants if not v.correct]
        assert len(wrong) >= 6 and sum(v.correct for v in variants) >= 2, name
        assert {v.question for v in wrong} == questions, f"{name}: a question without a wrong solution"
        assert {v.question for v in variants} <= questions
        assert len({v.name for v in variants}) == len(variants)


def test_every_question_has_a_wrong_solution_of_each_boundary_class():
    """Per question and boundary class (issue 45): a wrong solution of that class in the catalog (graded at every
    seed by the test below), or the reason the class does not apply."""
    for name, variants in CATALOG.items():
        a = harness.assignment(name)
        questions = {q.grade_id.removeprefix(f"{name}_").removesuffix("_tests") for q in a.questions}
        coverage = boundary.COVERAGE.get(name, {})
        assert set(coverage) == questions, f"{name}: boundary coverage of {sorted(coverage)}, not {sorted(questions)}"
        wrong = {v.name: v.question for v in variants if not v.correct}
        for question, classes in coverage.items():
            assert set(classes) == set(boundary.CLASSES), f"{name} {question}: classes {sorted(classes)}"
            for kind, entry in classes.items():
                if not entry.startswith("n/a: "):
                    assert wrong.get(entry) == question, f"{name} {question} {kind}: no wrong solution '{entry}'"


def _escapes(a, variants, seeds) -> dict[str, list[int]]:
    """Seeds at which each variant is misjudged: a wrong one at full marks, a correct one below them."""
    bad: dict[str, list[int]] = {v.name: [] for v in variants}
    for seed in seeds:
        ref = harness.reference(a, seed)
        for v in variants:
            got, best = harness.score(harness.grade_variant(a, ref, v, seed))
            if (got == best) != v.correct:
                bad[v.name].append(seed)
    return bad


@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", sorted(CATALOG))
def test_wrong_solutions_lose_points_and_alternatives_pass(name):
    a, variants = harness.assignment(name), CATALOG[name]
    t0 = time.perf_counter()
    bad = _escapes(a, variants, SEEDS)
    wrong = [v for v in variants if not v.correct]
    right = [v for v in variants if v.correct]
    _TABLE[name] = (sum(not bad[v.name] for v in wrong), len(wrong), sum(not bad[v.name] for v in right), len(right),
                    time.perf_counter() - t0)
    problems = [f"{'correct' if v.correct else 'wrong'} solution '{v.name}' ({v.question}) misjudged at "
                f"{len(bad[v.name])}/{len(SEEDS)} seeds, e.g. {bad[v.name][:5]}" for v in variants if bad[v.name]]
    assert not problems, "\n".join(problems)


REMOVED_CHECKS = [  # (assignment, test cell, text of the removed check's line, the mutant that then escapes)
    ("ps02_hogwild", "ps02_hogwild_q1_tests", 'check(f"coordinates written, random update', "returns the nonzeros"),
    ("ps04_syncasync", "ps04_syncasync_q2_tests", 'check(f"async_sgd leaves w0 unchanged',
     "async_sgd: updates the caller's w0 in place"),
]


@pytest.mark.parametrize(("name", "cell", "line", "mutant"), REMOVED_CHECKS, ids=[c[0] for c in REMOVED_CHECKS])
def test_removing_one_hidden_check_lets_a_wrong_solution_through(name, cell, line, mutant):
    """The suite has power: drop one hidden check and a mutant it alone catches gets full marks."""
    a = harness.assignment(name)
    weakened = harness.without_lines(a, cell, line)
    variant = next(v for v in CATALOG[name] if v.name.startswith(mutant))
    assert _escapes(a, [variant], range(3)) == {variant.name: []}
    assert _escapes(weakened, [variant], range(3)) == {variant.name: [0, 1, 2]}


def test_readme_lists_every_assignment_with_its_questions_and_points():
    """course/assignments/README.md has one row per question, with the source notebook's points."""
    readme = (harness.default_source_dir().parent / "README.md").read_text()
    listed: dict[str, list[tuple[float, str]]] = {}
    current = None
    for line in readme.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 6 or not re.match(r"q\d+ ", cells[2]):
            continue
        current = cells[0] or current
        listed.setdefault(current, []).append((float(cells[4]), cells[5]))
    expected = {}
    for name in CATALOG:
        a = harness.assignment(name)
        tests = harness.reference(a, 0)["tests"]
        expected[name] = [(q.points, f"{sum(not r['hidden'] for r in tests[q.grade_id]['records'])} + "
                                     f"{sum(r['hidden'] for r in tests[q.grade_id]['records'])}") for q in a.questions]
    assert listed == expected
    expected = {name: [p for p, _ in rows] for name, rows in expected.items()}
    for name, points in expected.items():
        assert f"{name.split('_')[0]} {sum(points):g}" in readme, f"the totals line lacks {name}"


SANDBOXED = ("shortcut: every rank returns the plain sum, no messages", "ring on flat buffers with chunk offsets")


@pytest.mark.timeout(600)
def test_the_sandboxed_grader_agrees_with_the_in_process_verdicts(tmp_path):
    """A few of ps05's variants through `dsgd-teach grade` (bubblewrap, kernels) score what the suite computes."""
    import csv

    import nbformat

    from dsgd_teach.grading import bubblewrap, cli
    from dsgd_teach.grading.notebook import nbgrader_meta

    try:
        bubblewrap.require()
    except RuntimeError as exc:
        pytest.skip(f"no sandbox here: {exc}")
    name, seed = "ps05_collectives", 11
    a = harness.assignment(name)
    variants = {v.name: v for v in CATALOG[name]}
    students = {"honest": harness.Variant("honest", "", True, "")}
    students.update({f"variant_{k}": variants[n] for k, n in enumerate(SANDBOXED)})
    for student, variant in students.items():
        nb = nbformat.read(str(harness.default_source_dir() / name / f"{name}.ipynb"), as_version=4)
        if variant.code:
            replaced = harness._defined(variant.code)
            target = [c for c in nb.cells if nbgrader_meta(c).get("solution") and replaced & harness._defined(c.source)]
            target[-1].source += "\n\n" + variant.code
        (tmp_path / "subs" / student).mkdir(parents=True)
        nbformat.write(nb, str(tmp_path / "subs" / student / f"{name}.ipynb"))
    out = tmp_path / "graded"
    assert cli.main([str(tmp_path / "subs"), "--assignment", name, "--out", str(out), "--seed", str(seed),
                     "--jobs", "2", "--no-progress", "--timeout", "30"]) == 0
    with open(out / "grades.csv", newline="") as fh:
        rows = {(r["student"], r["question"]): float(r["points"]) for r in csv.DictReader(fh)}
    ref = harness.reference(a, seed)
    for student, variant in students.items():
        expected = [g.points for g in harness.grade_variant(a, ref, variant, seed)]
        assert [rows[(student, q.grade_id)] for q in a.questions] == expected, student
        assert (student, "(integrity)") not in rows
    assert [rows[("honest", q.grade_id)] for q in a.questions] == [q.points for q in a.questions]
