"""Lecture mode: every chapter renders with `jupyter nbconvert --to slides` into a sensible reveal.js deck."""

from __future__ import annotations

import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import nbformat
import pytest

from dsgd_teach.course_runner import chapters

CHAPTERS = chapters()
MIN_SLIDES, MAX_SLIDES = 5, 60


class _Sections(HTMLParser):
    """Counts reveal.js <section> elements: top level = slides, nested = sub-slides."""

    def __init__(self) -> None:
        super().__init__()
        self.depth = 0
        self.top = 0
        self.nested = 0

    def handle_starttag(self, tag: str, attrs) -> None:  # noqa: ANN001 - HTMLParser's signature
        if tag == "section":
            self.top += self.depth == 0
            self.nested += self.depth == 1
            self.depth += 1

    def handle_endtag(self, tag: str) -> None:
        if tag == "section":
            self.depth -= 1


def slide_types(path: Path) -> list[str]:
    nb = nbformat.read(path, as_version=4)
    return [c.metadata.get("slideshow", {}).get("slide_type", "-") for c in nb.cells]


@pytest.fixture(scope="module")
def decks(tmp_path_factory) -> dict[str, str]:
    """All chapters converted in one nbconvert run (one interpreter start instead of one per chapter)."""
    if not CHAPTERS:
        pytest.skip("no chapters in course/")
    out = tmp_path_factory.mktemp("slides")
    cmd = [sys.executable, "-m", "jupyter", "nbconvert", "--to", "slides", "--output-dir", str(out)]
    proc = subprocess.run([*cmd, *map(str, CHAPTERS)], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, f"nbconvert --to slides failed:\n{proc.stderr[-3000:]}"
    return {p.stem: (out / f"{p.stem}.slides.html").read_text(encoding="utf-8") for p in CHAPTERS}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_renders_as_a_sensible_deck(path, decks):
    html = decks[path.stem]
    parser = _Sections()
    parser.feed(html)
    types = slide_types(path)
    assert parser.depth == 0, f"{path.name}: unbalanced <section> tags in the deck"
    assert types[0] == "slide", f"{path.name}: the title cell must open the first slide"
    assert parser.top == types.count("slide"), (
        f"{path.name}: {parser.top} slides rendered, {types.count('slide')} cells start one"
    )
    assert parser.nested == types.count("slide") + types.count("subslide"), f"{path.name}: sub-slides lost"
    assert MIN_SLIDES <= parser.top <= MAX_SLIDES, (
        f"{path.name}: {parser.top} slides; a lecture deck should have {MIN_SLIDES}-{MAX_SLIDES}"
    )
    assert "reveal" in html.lower(), f"{path.name}: not a reveal.js deck"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_every_heading_starts_a_slide_or_subslide(path):
    nb = nbformat.read(path, as_version=4)
    bad = [
        (i, c.source.splitlines()[0][:60])
        for i, c in enumerate(nb.cells)
        if c.cell_type == "markdown"
        and c.source.lstrip().startswith("#")
        and c.metadata.get("slideshow", {}).get("slide_type") not in ("slide", "subslide")
    ]
    assert not bad, f"{path.name}: heading cells that do not start a slide or sub-slide: {bad}"
