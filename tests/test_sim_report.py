"""The bench report: the README section between the markers, nothing else touched; plots written."""

from __future__ import annotations

import json

import pytest

from dsgd_teach.bench.report import MARK_END, MARK_START, bench_table, main, replace_section, write_plots

RESULTS = {
    "machine": {"python": "3.11", "platform": "Linux", "processor": "x86_64", "cores": 2, "torch": "2", "gpus": 0},
    "when": "2026-11-22 00:00:00 UTC",
    "benchmarks": {
        "sim": {"sync_1000w_wall_s": 3.5, "n2_sim_over_real_ratio": 1.07, "bench_wall_s": 40.0},
        "collectives": {"error": "TimeoutError: boom | bad", "traceback": "Traceback ..."},
    },
}


def test_section_lists_ratios_failures_and_machine() -> None:
    table = bench_table(RESULTS)
    assert "on 2 cores" in table and "| sim | n2_sim_over_real_ratio | 1.07 |" in table
    assert "| collectives | **failed** | TimeoutError: boom \\| bad |" in table
    assert "| sim | sync_1000w_wall_s | 3.5 |" in table and "Traceback" not in table


def test_replace_touches_only_the_marked_section() -> None:
    text = f"# title\n\nbefore\n{MARK_START}\nold table\n{MARK_END}\nafter\n"
    out = replace_section(text, "NEW")
    assert out == f"# title\n\nbefore\n{MARK_START}\nNEW\n{MARK_END}\nafter\n"
    assert replace_section(out, "NEWER").count("NEW") == 1
    with pytest.raises(ValueError, match="markers"):
        replace_section("no markers here", "x")


def test_main_rewrites_readme_and_writes_plots(tmp_path) -> None:
    results = tmp_path / "results.json"
    results.write_text(json.dumps(RESULTS))
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{MARK_START}\n{MARK_END}\n")
    assert main(["--results", str(results), "--readme", str(readme), "--out", str(tmp_path / "out")]) == 0
    assert "n2_sim_over_real_ratio" in readme.read_text() and readme.read_text().startswith("intro\n")
    assert sorted(p.name for p in write_plots(RESULTS, tmp_path / "out")) == ["bench_time.png", "ratios.png"]
    assert (tmp_path / "out" / "ratios.png").stat().st_size > 1000
