"""The bench runner: `--only` re-measures some benchmarks and keeps the others' last figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsgd_teach.bench import runner


def test_only_keeps_the_figures_of_the_benchmarks_it_did_not_run(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    runs: list[str] = []

    def fake_measure(name: str) -> dict[str, float]:
        runs.append(name)
        return {"figure": float(len(runs))}

    monkeypatch.setattr(runner, "BENCH_MODULES", ("dsgd_teach.bench.sim", "dsgd_teach.bench.pipeline"))
    monkeypatch.setattr(runner, "measure_in_fresh_process", fake_measure)
    runner.run_all(tmp_path)
    runner.run_all(tmp_path, only=["pipeline"])
    saved = json.loads((tmp_path / "results.json").read_text())["benchmarks"]
    assert saved == {"sim": {"figure": 1.0}, "pipeline": {"figure": 3.0}}
    assert runs == ["dsgd_teach.bench.sim", "dsgd_teach.bench.pipeline", "dsgd_teach.bench.pipeline"]
    first_when = json.loads((tmp_path / "results.json").read_text())["others_when"]
    header = (tmp_path / "results.md").read_text().splitlines()[0]
    assert f"(pipeline; the others from the run started {first_when})" in header  # the table says what is new


def test_a_fresh_clone_keeps_the_figures_the_page_lists(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without build/bench/results.json (a fresh clone), `--only` keeps the others' figures from the page's table,
    so re-measuring one benchmark never drops the rest from docs/benchmarks.md."""
    from dsgd_teach.bench.report import bench_table, replace_section, results_from_page

    earlier = {"when": "2026-01-02 03:04:05 UTC", "re_measured": ["pipeline"], "others_when": "2026-01-01 00:00:00 UTC",
               "benchmarks": {"sim": {"a_ratio": 1.25, "note": "text | with a bar", "gone": float("nan")},
                              "pipeline": {"b_ratio": 0.5}}}
    page = tmp_path / "benchmarks.md"
    page.write_text(replace_section("# B\n<!-- bench:start -->\n<!-- bench:end -->\n", bench_table(earlier)))
    parsed = results_from_page(page.read_text())
    assert parsed["when"] == earlier["when"] and parsed["others_when"] == earlier["others_when"]
    assert parsed["re_measured"] == ["pipeline"] and parsed["benchmarks"]["pipeline"] == {"b_ratio": 0.5}
    assert parsed["benchmarks"]["sim"]["a_ratio"] == 1.25 and parsed["benchmarks"]["sim"]["note"] == "text \\| with a bar"
    monkeypatch.setattr(runner, "BENCH_MODULES", ("dsgd_teach.bench.sim", "dsgd_teach.bench.zero"))
    monkeypatch.setattr(runner, "measure_in_fresh_process", lambda name: {"c_ratio": 2.0})
    results = runner.run_all(tmp_path / "out", only=["zero"], page=page)
    assert results["benchmarks"]["sim"]["a_ratio"] == 1.25 and results["benchmarks"]["pipeline"] == {"b_ratio": 0.5}
    assert results["benchmarks"]["zero"] == {"c_ratio": 2.0}
    assert results["re_measured"] == ["pipeline", "zero"] and results["others_when"] == earlier["others_when"]
