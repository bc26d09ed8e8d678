"""The course as a book: built from this run's executed chapters, opened in Chromium, every link resolving.

The chapters come from tests/book_support.py's folder (test_browser.py leaves its full-mode runs there, read from
JupyterLab); those this run has not executed yet are executed here in smoke mode. A last test breaks a copy of the
book and shows that the checks catch it.
"""

from __future__ import annotations

import contextlib
import functools
import re
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import nbformat
import pytest
from book_support import executed_dir
from browser_support import chromium, chromium_missing_reason

from dsgd_teach.book import build, stale_chapters
from dsgd_teach.book_check import broken_links
from dsgd_teach.course_runner import chapters, execute

pytestmark = [pytest.mark.notebook, pytest.mark.browser]
BINDER_REPO = "example-org/dsgd-teach"
CHAPTER_PAGES = [p.with_suffix(".html").name for p in chapters()]


@pytest.fixture(scope="module")
def book(tmp_path_factory) -> dict:
    """The built book's HTML folder and the executed chapters it was built from."""
    executed = executed_dir()
    t0 = time.perf_counter()
    for path in stale_chapters(executed):  # not executed yet in this test run
        # A chapter that fails is reported by the chapter tests; its executed copy, errors and all, is still written.
        with contextlib.suppress(Exception):
            execute(path, executed, timeout_s=300, html=False, snapshots=True)
    t1 = time.perf_counter()
    out = tmp_path_factory.mktemp("book")
    build(executed, out, BINDER_REPO)
    print(f"chapters executed here in {t1 - t0:.1f} s, book built in {time.perf_counter() - t1:.1f} s")
    return {"html": out / "html", "executed": executed}


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:  # noqa: D102 - the test reads failures from the browser
        pass


class _Server(ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:  # noqa: ANN001 - socketserver's signature
        """A browser that drops a connection it no longer needs is not an error; anything else is printed."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


@contextlib.contextmanager
def serve(root: Path) -> Iterator[str]:
    """The folder over HTTP on 127.0.0.1 (a port the OS picks), as a web host would serve the book."""
    server = _Server(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, name="book-http", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


PAGE_STATE = """() => ({
  images: [...document.querySelectorAll('article img')].map(i => [i.getAttribute('src'), i.complete && i.naturalWidth > 0]),
  math: document.querySelectorAll('article .math').length,
  rendered: [...document.querySelectorAll('article .math')]
      .filter(m => m.querySelector('mjx-container') && !m.querySelector('mjx-merror')).length,
  snapshots: document.querySelectorAll('.dsgd-panel-snapshot').length,
  snapshot_errors: document.querySelectorAll('.dsgd-panel-snapshot.dsgd-error').length,
  banner: (document.querySelector('.dsgd-run-banner') || {}).innerText || '',
  binder: document.querySelectorAll('a[href^="https://mybinder.org/"]').length,
  notation: document.querySelectorAll('a[href^="NOTATION.html"]').length,
  citations: document.querySelectorAll('a[href^="bibliography.html#"]').length,
})"""


def open_page(context, base: str, name: str) -> tuple[dict, list[str]]:
    """Load one page; return its state once MathJax has typeset, and what went wrong while loading it."""
    page = context.new_page()
    problems: list[str] = []
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url}"))
    page.on("response", lambda r: problems.append(f"HTTP {r.status}: {r.url}") if r.status >= 400 else None)
    page.on("request", lambda r: None if r.url.startswith((base, "data:")) else problems.append(f"offsite: {r.url}"))
    try:
        page.goto(f"{base}/{name}", wait_until="load", timeout=60_000)
        page.evaluate("() => window.MathJax && MathJax.startup ? MathJax.startup.promise : null")
        return page.evaluate(PAGE_STATE), problems
    finally:
        page.close()


def expected_outputs(executed: Path, page: str) -> tuple[int, int]:
    """(figures, panel snapshots) the executed chapter holds: the page must show as many."""
    nb = nbformat.read(executed / page.replace(".html", ".ipynb"), as_version=4)
    outputs = [o for c in nb.cells for o in c.get("outputs", [])]
    figures = sum(1 for o in outputs if any(k.startswith("image/") for k in o.get("data", {})))
    snapshots = sum(1 for o in outputs if "dsgd-panel-snapshot" in str(o.get("data", {}).get("text/html", "")))
    return figures, snapshots


def chapter_problems(context, base: str, executed: Path, page: str) -> list[str]:
    """What is wrong with one chapter page: load errors, broken figures, unrendered math, missing pieces."""
    state, problems = open_page(context, base, page)
    figures, snapshots = expected_outputs(executed, page)
    nb = nbformat.read(executed / page.replace(".html", ".ipynb"), as_version=4)
    widgets = sum(1 for c in nb.cells for o in c.get("outputs", [])  # panels: widgets without a PNG of their own
                  if "application/vnd.jupyter.widget-view+json" in o.get("data", {})
                  and not any(k.startswith("image/") for k in o.get("data", {})))
    broken = [src for src, ok in state["images"] if not ok]
    problems += [f"broken image {src}" for src in broken]
    if len(state["images"]) < figures:
        problems.append(f"{len(state['images'])} images shown, the executed chapter has {figures}")
    if state["rendered"] < state["math"]:
        problems.append(f"{state['math'] - state['rendered']} of {state['math']} equations not rendered")
    if widgets and (snapshots < 1 or state["snapshots"] < snapshots):
        problems.append(f"{widgets} widget outputs, {snapshots} panel snapshots run, {state['snapshots']} shown")
    if state["snapshot_errors"]:
        problems.append(f"{state['snapshot_errors']} panel snapshot(s) show an error")
    machine = nb.metadata["dsgd_teach"]["machine"]
    if machine not in state["banner"] or nb.metadata["dsgd_teach"]["executed_at"] not in state["banner"]:
        problems.append(f"the banner does not name the machine and date: {state['banner']!r}")
    if not state["binder"] or not state["notation"]:
        problems.append(f"no Binder launch link ({state['binder']}) or notation link ({state['notation']})")
    return [f"{page}: {p}" for p in problems]


@pytest.mark.timeout(1800)
def test_every_page_loads_in_chromium_with_its_figures_and_equations(book, tmp_path):
    if reason := chromium_missing_reason():
        pytest.skip(reason)
    html: Path = book["html"]
    # Beside the chapters, one page of each other kind (the link checker reads them all).
    others = ["index.html", "NOTATION.html", "bibliography.html", "guide.html", "assignments/index.html",
              min(str(p.relative_to(html)) for p in html.glob("solutions/0*.html")),
              min(str(p.relative_to(html)) for p in html.glob("assignments/ps*.html"))]
    problems: list[str] = []
    citations = 0
    with serve(html) as base, chromium(tmp_path / "profile") as context:
        for page in CHAPTER_PAGES:
            problems += chapter_problems(context, base, book["executed"], page)
        for page in others:
            state, load = open_page(context, base, page)
            citations += state["citations"]
            problems += [f"{page}: {p}" for p in load]
            problems += [f"{page}: broken image {src}" for src, ok in state["images"] if not ok]
            problems += [f"{page}: equations not rendered"] if state["rendered"] < state["math"] else []
    assert not problems, "\n".join(problems)
    assert citations, "no page links a citation to the bibliography"


@pytest.mark.timeout(300)
def test_link_checker_finds_no_broken_internal_links(book):
    html: Path = book["html"]
    assert broken_links(html) == []
    index = (html / "index.html").read_text()
    assert all(f'href="{page}"' in index for page in CHAPTER_PAGES), "a chapter is missing from the contents"
    bibliography = (html / "bibliography.html").read_text()
    for page in CHAPTER_PAGES:  # every citation of a chapter points at an entry of the bibliography
        for anchor in re.findall(r'href="bibliography.html#([^"]+)"', (html / page).read_text()):
            assert f'id="{anchor}"' in bibliography, (page, anchor)


@pytest.mark.timeout(300)
def test_search_finds_a_chapter(book, tmp_path):
    if reason := chromium_missing_reason():
        pytest.skip(reason)
    with serve(book["html"]) as base, chromium(tmp_path / "profile") as context:
        page = context.new_page()
        page.goto(f"{base}/search.html?q=Hogwild", wait_until="load")
        page.wait_for_selector("#search-results li a", timeout=60_000)
        hits = page.eval_on_selector_all("#search-results li a", "links => links.map(a => a.getAttribute('href'))")
    assert any(h.startswith("02_hogwild.html") for h in hits), hits


@pytest.mark.timeout(600)
def test_the_checks_fail_on_a_broken_book(book, tmp_path):
    """A figure file gone and a cross-reference pointing nowhere: the link checker and the page check both say so."""
    if reason := chromium_missing_reason():
        pytest.skip(reason)
    broken = tmp_path / "html"
    shutil.copytree(book["html"], broken)
    page = next(p for p in CHAPTER_PAGES if expected_outputs(book["executed"], p)[0])
    text = (broken / page).read_text()
    figure = re.search(r'<img[^>]*src="(_images/[^"]+)"', text).group(1)
    (broken / figure).unlink()
    (broken / page).write_text(text.replace('href="NOTATION.html', 'href="NOTATION.html#no-such-section', 1))
    problems = broken_links(broken)
    assert any(figure in p and "no such file" in p for p in problems), problems
    assert any("no anchor #no-such-section" in p for p in problems), problems
    with serve(broken) as base, chromium(tmp_path / "profile") as context:
        found = chapter_problems(context, base, book["executed"], page)
    assert any(f"broken image {figure}" in p for p in found), found


PANEL_NOTEBOOK = [
    "from dsgd_teach import start_client\nfrom dsgd_teach.panel import ExperimentPanel\n"
    "from dsgd_teach.sgd import DataParallelConfig, run_data_parallel\nclient = start_client(1, quiet=True)",
    "ExperimentPanel(client, run_data_parallel, DataParallelConfig(workers=1, steps=6), resize_cluster=False, "
    "title='tiny')",
    "client.close()",
]


@pytest.mark.timeout(300)
def test_a_panel_leaves_a_static_figure_of_its_run_when_executed(tmp_path):
    source = tmp_path / "panel.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in PANEL_NOTEBOOK]), source)
    execute(source, tmp_path / "out", timeout_s=240, html=False, snapshots=True)
    outputs = nbformat.read(tmp_path / "out" / source.name, as_version=4).cells[1].outputs
    kinds = [sorted(o.get("data", {})) for o in outputs]
    assert "application/vnd.jupyter.widget-view+json" in kinds[0], kinds
    assert len(outputs) == 3 and "image/png" in kinds[1], kinds
    caption = outputs[2].data["text/html"]
    assert "dsgd-panel-snapshot" in caption and "Done in" in caption and "final_train_loss" in caption, caption
