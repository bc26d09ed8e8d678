"""Every chapter executes headless in smoke mode, is committed without outputs, and is ready for slides."""

from __future__ import annotations

import json
import os
from pathlib import Path

import nbformat
import pytest

from dsgd_teach.course_runner import COURSE_DIR, chapters, execute

CHAPTERS = chapters()


def test_the_course_has_its_chapters():
    names = [p.name for p in CHAPTERS]
    assert names[:2] == ["00_live_cluster.ipynb", "01_sgd.ipynb"]


@pytest.mark.parametrize("path", sorted(COURSE_DIR.rglob("*.ipynb")), ids=lambda p: p.name)
def test_committed_without_outputs(path):
    nb = json.loads(path.read_text())
    dirty = [i for i, c in enumerate(nb["cells"]) if c.get("outputs") or c.get("execution_count")]
    assert not dirty, f"{path.name}: cells {dirty} carry outputs; clear them before committing"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_structure(path):
    nb = nbformat.read(path, as_version=4)
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# ")
    assert "learning goals" in nb.cells[0].source.lower()
    missing = [i for i, c in enumerate(nb.cells) if "slide_type" not in c.metadata.get("slideshow", {})]
    assert not missing, f"cells without slide metadata: {missing}"
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    assert "client.close()" in code[-1], "the chapter must close its client in its last cell"
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown").lower()
    assert "what to try" in text and "exercise" in text


@pytest.mark.notebook
@pytest.mark.timeout(420)
@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_executes_in_smoke_mode(path, tmp_path, monkeypatch):
    monkeypatch.setenv("DSGD_SMOKE", "1")
    execute(path, tmp_path, timeout_s=300, html=False)
    nb = nbformat.read(tmp_path / path.name, as_version=4)
    errors = [
        f"cell {i}: {o.get('ename')}: {o.get('evalue')}"
        for i, c in enumerate(nb.cells)
        for o in c.get("outputs", [])
        if o.output_type == "error"
    ]
    assert not errors, errors
    stderr = [
        o.text for c in nb.cells for o in c.get("outputs", []) if o.output_type == "stream" and o.name == "stderr"
    ]
    assert not any("Traceback" in s for s in stderr), stderr
    assert os.environ["DSGD_SMOKE"] == "1"
    assert Path(tmp_path / path.name).exists()
