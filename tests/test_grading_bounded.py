"""The grader's own memory is bounded: what a submission gives it is bounded before it is parsed, in a capped child."""

from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat
import pytest
from grading_attacks import write_parse_bomb, write_submission

from dsgd_teach.grading import batch, jsonbound, nbread, reports
from dsgd_teach.grading.batch import Limits, Submission, grade_one
from dsgd_teach.grading.notebook import load_assignment, rebuild

PS01 = Path(__file__).resolve().parents[1] / "course" / "assignments" / "source" / "ps01_sgd" / "ps01_sgd.ipynb"
MB = 1 << 20
GRADER_RISE_MB = 64  # what reading one hostile submission may add to the grader's own peak RSS


def _status(key: str) -> int:
    return int(re.search(rf"^{key}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.M).group(1)) << 10


def peak_rise(fn) -> int:
    """Bytes by which this process's peak RSS (VmHWM, reset first) rose above its RSS while fn ran."""
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS (Linux 4.0+)
    except OSError as exc:
        pytest.skip(f"cannot reset the peak RSS here: {exc}")
    before = _status("VmRSS")
    fn()
    return _status("VmHWM") - before


def test_bounds_count_containers_elements_and_depth_but_not_string_contents():
    small = jsonbound.Bounds(1000, max_containers=3, max_elements=3, max_depth=2)
    jsonbound.check(b'{"a": ["{{{{[[[[,,,,", "\\"]]"]}', small)
    for text, word in ((b"[{},{},{}]", "objects and arrays"), (b"[1,2,3,4,5]", "elements"), (b"[[[1]]]", "nested"),
                       (b" " * 1001, "larger")):
        with pytest.raises(jsonbound.TooLarge, match=word):
            jsonbound.check(text, small)


def test_a_parse_bomb_costs_the_grader_no_memory_and_scores_zero_with_the_reason(tmp_path, monkeypatch):
    bomb = tmp_path / "mallory" / "ps01_sgd.ipynb"
    write_parse_bomb(PS01, bomb)
    assert 10 * MB < bomb.stat().st_size < nbread.MAX_BYTES
    assignment = load_assignment(PS01)
    monkeypatch.setattr(batch, "run_worker", lambda *a, **k: {"error": "a parse bomb reached a worker"})
    grades = []
    rise = peak_rise(lambda: grades.extend(grade_one(Submission("mallory", "ps01_sgd", bomb), assignment, {},
                                                     Limits(), 1, [])))
    assert rise < GRADER_RISE_MB * MB, f"the grader's peak RSS rose by {rise // MB} MB"
    assert [g.points for g in grades] == [0.0] * 3, grades
    assert all("could not read the notebook" in g.reason and "200,000 JSON objects" in g.reason for g in grades)
    assert not any(g.question == "(integrity)" for g in grades)


def test_the_reading_child_keeps_every_cell_grading_needs(tmp_path):
    nb_path = tmp_path / "good.ipynb"
    write_submission(PS01, nb_path, "good")
    assignment = load_assignment(PS01)
    ours, theirs = nbread.read(nb_path), nbformat.read(str(nb_path), as_version=4)
    assert rebuild(assignment, ours) == rebuild(assignment, theirs)
    chaos = tmp_path / "chaos.ipynb"
    chaos.write_text(json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": [], "cells": [
        7, {"cell_type": "code", "source": ["x = ", 1, "2"], "metadata": "m"},
        {"cell_type": "code", "source": "y = 3", "metadata": {"nbgrader": {"grade_id": {"deep": [1]}}}},
        {"cell_type": "widget", "source": "z"}]}))
    nb = nbread.read(chaos)
    assert [c.source for c in nb.cells] == ["x = 2", "y = 3"]
    assert "dsgd_invalid" in nb.cells[1].metadata.nbgrader
    assert nb.metadata.dsgd_teach_grading.problems == ["2 cell(s) of an unknown type or shape were dropped"]


def test_a_result_of_millions_of_containers_is_refused_before_it_is_parsed():
    data = b'{"tests": {"q": {"status": "ok", "records": [' + b",".join([b"[]"] * 5_000_000) + b"]}}}"
    assert len(data) < reports.MAX_RESULT_BYTES
    def parse() -> None:
        try:
            reports.parse(data)
        except reports.BadReport:
            pass

    rise = peak_rise(parse)
    assert rise < GRADER_RISE_MB * MB, f"the grader's peak RSS rose by {rise // MB} MB"
    with pytest.raises(reports.BadReport, match="more than 200,000 JSON objects"):
        reports.parse(data)


@pytest.mark.parametrize("error", ["the grading process failed (exit 137): no output",
                                   "grading this notebook took longer than 95 s and was stopped"])
def test_a_dead_or_overrun_worker_gives_its_reason_unflagged(error, monkeypatch):
    assignment = load_assignment(PS01)
    monkeypatch.setattr(batch, "run_worker", lambda *a, **k: {"error": error})
    grades = grade_one(Submission("eve", "ps01_sgd", PS01), assignment, {}, Limits(), 1, [])
    assert [(g.points, g.reason) for g in grades] == [(0.0, error)] * 3
