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
    saved = json.loads((tmp_path / "results.json").read_text())
    figures = {name: {k: v for k, v in f.items() if k != "measured_at"} for name, f in saved["benchmarks"].items()}
    assert figures == {"sim": {"figure": 1.0}, "pipeline": {"figure": 3.0}}
    assert runs == ["dsgd_teach.bench.sim", "dsgd_teach.bench.pipeline", "dsgd_teach.bench.pipeline"]
    first_when = saved["benchmarks"]["sim"]["measured_at"]
    assert saved["benchmarks"]["pipeline"]["measured_at"] == saved["when"]
    header = (tmp_path / "results.md").read_text().splitlines()[0]
    if first_when != saved["when"]:  # the two runs fell in different seconds: the table says which is newer
        assert f"{saved['when']} (pipeline); the others {first_when}" in header


def test_a_fresh_clone_keeps_the_figures_the_page_lists(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without build/bench/results.json (a fresh clone), `--only` keeps the others' figures from the page's table,
    so re-measuring one benchmark never drops the rest from docs/benchmarks.md."""
    from dsgd_teach.bench.report import bench_table, replace_section, results_from_page

    earlier = {"when": "2026-01-02 03:04:05 UTC", "re_measured": ["pipeline"], "others_when": "2026-01-01 00:00:00 UTC",
               "benchmarks": {"sim": {"a_ratio": 1.25, "note": "text | with a bar", "gone": float("nan")},
                              "pipeline": {"b_ratio": 0.5}}}
    page = tmp_path / "benchmarks.md"
    table = bench_table(earlier).splitlines()
    table[0] = (f"Measured {earlier['when']} (pipeline; the others from the run started {earlier['others_when']}) "
                "on 2 cores (x86_64, Linux), Python 3.11.7, torch 2.13.0+cpu, GPUs: 0.")  # the page's older form
    page.write_text(replace_section("# B\n<!-- bench:start -->\n<!-- bench:end -->\n", "\n".join(table)))
    parsed = results_from_page(page.read_text())
    assert parsed["when"] == earlier["when"] and parsed["others_when"] == earlier["others_when"]
    assert parsed["re_measured"] == ["pipeline"] and parsed["benchmarks"]["pipeline"] == {"b_ratio": 0.5}
    assert parsed["benchmarks"]["sim"]["a_ratio"] == 1.25 and parsed["benchmarks"]["sim"]["note"] == "text \\| with a bar"
    monkeypatch.setattr(runner, "BENCH_MODULES", ("dsgd_teach.bench.sim", "dsgd_teach.bench.zero"))
    monkeypatch.setattr(runner, "measure_in_fresh_process", lambda name: {"c_ratio": 2.0})
    results = runner.run_all(tmp_path / "out", only=["zero"], page=page)
    got = results["benchmarks"]
    assert got["sim"]["a_ratio"] == 1.25 and got["pipeline"]["b_ratio"] == 0.5 and got["zero"]["c_ratio"] == 2.0
    # each benchmark keeps the date it was measured on, and the page's line says so
    assert got["sim"]["measured_at"] == earlier["others_when"] and got["pipeline"]["measured_at"] == earlier["when"]
    assert got["zero"]["measured_at"] == results["when"]
    line = bench_table(results).splitlines()[0]
    assert f"{earlier['when']} (pipeline)" in line and f"{results['when']} (zero)" in line
    assert f"the others {earlier['others_when']}" in line
    again = results_from_page(replace_section(page.read_text(), bench_table(results)))
    assert again["benchmarks"]["pipeline"]["measured_at"] == earlier["when"]  # read back from the page
    assert results_from_page("| x | y | 7 |\n")  == {} and _figure_kinds()


def _figure_kinds() -> bool:
    """Integers come back as integers, so re-writing a page never turns 1966137 into 1.966e+06."""
    from dsgd_teach.bench.report import _figure

    return _figure("1966137") == 1966137 and isinstance(_figure("1966137"), int) and _figure("0.5") == 0.5 \
        and _figure("n/a") != _figure("n/a") and _figure("text") == "text"
