"""Mutation score of the graded assignments: wrong solutions caught and correct alternatives at full marks.

The catalog and the in-process grading live with the test suite (`tests/mutants/`): every wrong solution (one
realistic mistake) must lose points at every hidden-input seed, every correct alternative must score full marks at
every seed. This unit replays that over SEEDS seeds and reports, per assignment and overall, how many of each held
at all of them. It needs a source checkout (the catalog is not installed with the package).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

SEEDS = 50


def _mutants():
    tests = Path(__file__).resolve().parents[2] / "tests"
    if not (tests / "mutants" / "catalog.py").is_file():
        raise FileNotFoundError(f"no mutant catalog at {tests / 'mutants'} (run from a source checkout)")
    if str(tests) not in sys.path:
        sys.path.insert(0, str(tests))
    from mutants import harness
    from mutants.catalog import CATALOG

    return harness, CATALOG


def measure(seeds: int = SEEDS) -> dict[str, float | str]:
    """`mutation_score_ratio` (wrong solutions caught at every seed / all wrong solutions) and
    `alternatives_full_marks_ratio` (correct alternatives at full marks at every seed / all of them) are the figures
    to quote; both should be 1. Per assignment: `<ps>_caught` and `<ps>_alternatives` as "k/n"."""
    harness, catalog = _mutants()
    figures: dict[str, float | str] = {"seeds": float(seeds)}
    caught = wrong = passed = right = 0
    t0 = time.perf_counter()
    for name in sorted(catalog):
        a, variants = harness.assignment(name), catalog[name]
        bad = {v.name: False for v in variants}
        for seed in range(seeds):
            ref = harness.reference(a, seed)
            for v in variants:
                got, best = harness.score(harness.grade_variant(a, ref, v, seed))
                bad[v.name] |= (got == best) != v.correct
        k_wrong = [not bad[v.name] for v in variants if not v.correct]
        k_right = [not bad[v.name] for v in variants if v.correct]
        figures[f"{name}_caught"] = f"{sum(k_wrong)}/{len(k_wrong)}"
        figures[f"{name}_alternatives"] = f"{sum(k_right)}/{len(k_right)}"
        caught, wrong = caught + sum(k_wrong), wrong + len(k_wrong)
        passed, right = passed + sum(k_right), right + len(k_right)
    figures.update({"wrong_solutions": float(wrong), "alternatives": float(right),
                    "mutation_score_ratio": round(caught / wrong, 4) if wrong else 0.0,
                    "alternatives_full_marks_ratio": round(passed / right, 4) if right else 0.0,
                    "grading_s": round(time.perf_counter() - t0, 1)})
    return figures


if __name__ == "__main__":
    for key, value in measure(int(sys.argv[1]) if len(sys.argv) > 1 else SEEDS).items():
        print(f"{key:32} {value}")
