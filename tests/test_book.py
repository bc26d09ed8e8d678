"""The course as a book: built from this run's executed chapters, opened in Chromium, every link resolving.

The chapters come from tests/book_support.py's folder (test_browser.py leaves its full-mode runs there, read from
JupyterLab); those this run has not executed yet are executed here in smoke mode. A test breaks a copy of the book
and shows that the checks catch it. Without a book: every widget a notebook shows leaves a static copy when executed
for the book, and each chapter's launch links (Binder from the origin remote, a local `make lab`) are right.
"""

from __future__ import annotations

import contextlib
import functools
import re
import shutil
import subprocess
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

from dsgd_teach.book import build, default_binder_repo, github_repo, stale_chapters
from dsgd_teach.book_check import WIDGET_VIEW, broken_links, widgets_without_static
from dsgd_teach.book_sources import LOCAL_LAB, ROOT, stage_chapter
from dsgd_teach.course_runner import chapters, execute

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
  launch: [...document.querySelectorAll('.dsgd-run-banner a')].map(a => a.getAttribute('href')),
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
    """(figures, static copies of widgets) the executed chapter holds: the page must show as many."""
    nb = nbformat.read(executed / page.replace(".html", ".ipynb"), as_version=4)
    outputs = [o for c in nb.cells for o in c.get("outputs", [])]
    figures = sum(1 for o in outputs if any(k.startswith("image/") for k in o.get("data", {})))
    snapshots = sum(1 for o in outputs if "dsgd-panel-snapshot" in str(o.get("data", {}).get("text/html", "")))
    return figures, snapshots


def chapter_problems(context, base: str, executed: Path, page: str) -> list[str]:
    """What is wrong with one chapter page: load errors, broken figures, unrendered math, missing pieces."""
    state, problems = open_page(context, base, page)
    figures, snapshots = expected_outputs(executed, page)
    notebook = page.replace(".html", ".ipynb")
    nb = nbformat.read(executed / notebook, as_version=4)
    problems += widgets_without_static(nb)  # every widget output, each with its own static copy after it
    broken = [src for src, ok in state["images"] if not ok]
    problems += [f"broken image {src}" for src in broken]
    if len(state["images"]) < figures:
        problems.append(f"{len(state['images'])} images shown, the executed chapter has {figures}")
    if state["rendered"] < state["math"]:
        problems.append(f"{state['math'] - state['rendered']} of {state['math']} equations not rendered")
    if state["snapshots"] < snapshots:
        problems.append(f"{snapshots} static copies of widgets in the executed chapter, {state['snapshots']} shown")
    if state["snapshot_errors"]:
        problems.append(f"{state['snapshot_errors']} panel snapshot(s) show an error")
    machine = nb.metadata["dsgd_teach"]["machine"]
    if machine not in state["banner"] or nb.metadata["dsgd_teach"]["executed_at"] not in state["banner"]:
        problems.append(f"the banner does not name the machine and date: {state['banner']!r}")
    binder = f"https://mybinder.org/v2/gh/{BINDER_REPO}/HEAD?urlpath=lab/tree/course/{notebook}"
    for link in (binder, f"{LOCAL_LAB}{notebook}"):
        if link not in state["launch"]:
            problems.append(f"the banner has no launch link {link}: {state['launch']}")
    if not state["notation"]:
        problems.append("no notation link")
    return [f"{page}: {p}" for p in problems]


@pytest.mark.notebook
@pytest.mark.browser
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


@pytest.mark.notebook
@pytest.mark.browser
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


@pytest.mark.notebook
@pytest.mark.browser
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


@pytest.mark.notebook
@pytest.mark.browser
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


@pytest.mark.notebook
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


WIDGET_NOTEBOOK = [
    "from dsgd_teach.sharded.fit_widget import fit_widget\nfit_widget()",
    "from dsgd_teach.collectives.ringviz import ring_stepper\nring_stepper(n=3, k=7)",
    "import ipywidgets as widgets\nimport dsgd_teach.panel\n"
    "widgets.VBox([widgets.IntSlider(value=3, description='x'),\n"
    "              widgets.HTML('<table><tr><td>a cell</td></tr></table>')])",
]


@pytest.mark.notebook
@pytest.mark.timeout(300)
def test_every_widget_a_notebook_shows_leaves_a_static_copy_when_executed_for_the_book(tmp_path):
    """Chapter 09's will-it-fit calculator leaves its table, chapter 05's ring stepper all its steps, any other widget
    a cell shows (chapter 10's ranking) its pictures, HTML and settings; executed without snapshots, none does and
    the book's check names each widget."""
    source = tmp_path / "widgets.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in WIDGET_NOTEBOOK]), source)
    execute(source, tmp_path / "plain", timeout_s=240, html=False, snapshots=False)
    plain = nbformat.read(tmp_path / "plain" / source.name, as_version=4)
    assert len(widgets_without_static(plain)) == 3, widgets_without_static(plain)
    execute(source, tmp_path / "book", timeout_s=240, html=False, snapshots=True)
    nb = nbformat.read(tmp_path / "book" / source.name, as_version=4)
    assert widgets_without_static(nb) == []
    kinds = [[sorted(o.get("data", {})) for o in cell.outputs] for cell in nb.cells]
    assert all(WIDGET_VIEW in cell[0] for cell in kinds), kinds
    fit, ring, other = (cell.outputs[-1].data["text/html"] for cell in nb.cells)
    assert "total per GPU" in fit and "model = &#x27;7B&#x27;" in fit, fit
    assert "image/png" in kinds[1][1] and "all its 4 steps" in ring, (kinds, ring)
    assert "x = 3" in other and "a cell" in other, other


def _notebook(*cells: list[dict]) -> nbformat.NotebookNode:
    return nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("", outputs=outputs) for outputs in cells])


def test_the_static_copy_check_names_each_widget_without_one():
    widget = nbformat.v4.new_output("display_data", {WIDGET_VIEW: {"model_id": "m"}, "text/plain": "VBox()"})
    figure = nbformat.v4.new_output("display_data", {"image/png": "iVBORw0KGgo="})
    caption = nbformat.v4.new_output("display_data", {"text/html": "<div class='dsgd-panel-snapshot'>..</div>"})
    ipympl = nbformat.v4.new_output("display_data", {WIDGET_VIEW: {"model_id": "c"}, "image/png": "iVBORw0KGgo="})
    assert widgets_without_static(_notebook([widget, figure, caption], [widget, figure, caption, figure, caption],
                                            [ipympl])) == []
    assert widgets_without_static(_notebook([widget, widget, figure, caption])) == [
        "cell 0 (In [None]): output 0 is a widget with no static copy after it"]
    assert len(widgets_without_static(_notebook([widget, figure], [caption]))) == 1  # a later cell's copy is not its
    assert len(widgets_without_static(_notebook([caption, widget]))) == 1  # nor one before it


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def _banner(tmp_path: Path, binder_repo: str | None) -> str:
    """The launch sentence of chapter 05's page, staged from a small executed copy."""
    executed = tmp_path / "executed" / "05_allreduce.ipynb"
    executed.parent.mkdir(exist_ok=True)
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# Allreduce")]), executed)
    staged = stage_chapter(executed, tmp_path, {"05": executed.name}, binder_repo)
    return nbformat.read(staged, as_version=4).cells[1].source


def test_launch_links_come_from_the_origin_remote_else_a_local_lab(tmp_path, monkeypatch):
    """No network: the remote is only named. A GitHub origin (or BINDER_REPO) gives each chapter a Binder link to its
    notebook; without one, each chapter links to itself in the JupyterLab `make lab` starts, and says how."""
    monkeypatch.delenv("BINDER_REPO", raising=False)
    repo = tmp_path / "clone"
    repo.mkdir()
    _git(repo, "init", "-q")
    assert default_binder_repo(repo) is None
    local = _banner(tmp_path, default_binder_repo(repo))
    assert "mybinder.org" not in local and f"]({LOCAL_LAB}05_allreduce.ipynb)" in local and "`make lab`" in local, local
    _git(repo, "remote", "add", "origin", "git@github.com:someone/dsgd-teach.git")
    assert default_binder_repo(repo) == "someone/dsgd-teach"
    binder = _banner(tmp_path, default_binder_repo(repo))
    assert "(https://mybinder.org/v2/gh/someone/dsgd-teach/HEAD?urlpath=lab/tree/course/05_allreduce.ipynb)" in binder
    assert f"]({LOCAL_LAB}05_allreduce.ipynb)" in binder, binder
    monkeypatch.setenv("BINDER_REPO", "lecturer/fork")
    assert default_binder_repo(repo) == "lecturer/fork"
    _git(repo, "remote", "set-url", "origin", "https://gitlab.com/someone/dsgd-teach.git")
    monkeypatch.delenv("BINDER_REPO")
    assert default_binder_repo(repo) is None  # Binder's gh/ launcher: GitHub only
    urls = ("https://github.com/a/b", "https://github.com/a/b.git/", "ssh://git@github.com/a/b.git")
    assert [github_repo(u) for u in urls] == ["a/b"] * 3


def test_the_local_lab_link_is_where_make_lab_serves_the_chapters():
    """`make lab` serves course/ as the server's root on JupyterLab's default port: LOCAL_LAB + chapter opens it."""
    lab = re.search(r"^lab:.*?(?=^\S)", (ROOT / "Makefile").read_text(), re.S | re.M).group(0)
    assert "--ServerApp.root_dir=course" in lab and not re.search(r"--(ServerApp\.)?port", lab), lab
    assert LOCAL_LAB == "http://localhost:8888/lab/tree/"
