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
