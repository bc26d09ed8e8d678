"""Lecture mode in a real browser: chapters 04 and 05 presented as a RISE slideshow in headless Chromium.

A lecturer runs the chapter, presses Alt+R and talks through the slides. The test does the same in the classic
notebook's RISE (`rise`, served by `nbclassic` next to JupyterLab): it runs the chapter's set-up cells (its client)
and the section of its panel (whole chapters run in test_browser.py and test_external_deployment.py; here the
point is the panel in slide mode), waits until the panel has rendered, enters slide mode, advances slide by slide with Space until the
widget panel is on the current slide, changes a control, clicks Run, and checks, without leaving slide mode, that
the status reaches "Done" and the live figure's pixels change. Both happen only if what the panel's background run
thread sends (widget state and ipympl frames; ipykernel 7 changed how output from threads is routed) reaches the
browser: `test_the_check_fails_when_thread_messages_are_dropped` drops exactly those messages and sees the check
fail: the kernel reports the run done while the slide still shows it running.

JupyterLab's own slide mode (jupyterlab-rise) is tried too. jupyterlab-rise 0.43.1, the newest on PyPI, bundles
JupyterLab 4.3.4's core, and the widget manager built for the JupyterLab installed here (4.6) does not load into it
("Unsatisfied version ... of shared singleton module"), so panels show as their text repr there
(jupyterlab-contrib/rise#119 and #126): that test ends as an expected failure until a release loads the widget
manager, and then runs the same checks. Slides without widgets work in both.
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest
from browser_support import chromium, chromium_missing_reason, jupyter_lab
from test_browser import _is_blank, change_a_control

from dsgd_teach.course_runner import COURSE_DIR

pytestmark = [pytest.mark.browser, pytest.mark.timeout(900)]

SCREENSHOTS = Path(__file__).resolve().parents[1] / "build" / "screenshots"
CHAPTERS = ("04_sync_async", "05_allreduce")
RUN_BUTTON = re.compile(r"^\s*Run\s*$")
#: Seconds a panel's run may take before its status must read Done.
PANEL_TIMEOUT_S = 240
#: Seconds the negative control watches the slide after the kernel reported the run done: what the run thread
#: sent before it ended reaches the page before the kernel's report does, and is drawn within this window.
SETTLE_S = 5


def setup(steps: int) -> str:
    """A deck's cell: a one-worker client and an SGD panel of `steps` steps (a draw every 10)."""
    return f"""\
from dsgd_teach import start_client
from dsgd_teach.panel import ExperimentPanel
from dsgd_teach.sgd import SGDConfig, run_sgd
import ipywidgets as widgets

client = start_client(1, quiet=True, use_gpu=False)
panel = ExperimentPanel(client, run_sgd, SGDConfig(steps={steps}, eval_every=10), resize_cluster=False,
                        controls={{"lr": widgets.Dropdown(options=[0.05, 0.2], value=0.05, description="lr")}})
panel"""


#: Run first in the kernel: every comm message sent from a thread other than the kernel's main thread is dropped.
DROP_THREAD_MESSAGES = """\
import threading
import ipykernel.comm.comm as kernel_comm

_publish = kernel_comm.BaseComm.publish_msg

def _main_thread_only(self, *args, **kwargs):
    if threading.current_thread() is threading.main_thread():
        return _publish(self, *args, **kwargs)

kernel_comm.BaseComm.publish_msg = _main_thread_only"""


def _deck(root: Path, name: str, sources: list[str]) -> None:
    """A notebook of code cells, each on a slide of its own, and a closing markdown slide."""
    v4 = nbformat.v4
    cells = [v4.new_code_cell(s, metadata={"slideshow": {"slide_type": "slide"}}) for s in sources]
    cells.append(v4.new_markdown_cell("## The next slide", metadata={"slideshow": {"slide_type": "slide"}}))
    nb = v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["rise"] = {"scroll": True}
    nbformat.write(nb, root / f"{name}.ipynb")


@pytest.fixture(scope="module")
def slides(tmp_path_factory) -> Iterator[tuple[object, object]]:  # noqa: ANN001
    """A Jupyter server (JupyterLab and the classic notebook) on a copy of the two chapters and two decks."""
    reason = chromium_missing_reason()
    if reason:
        pytest.skip(reason)
    tmp = tmp_path_factory.mktemp("slides")
    root = tmp / "course"
    root.mkdir()
    for chapter in CHAPTERS:
        shutil.copyfile(COURSE_DIR / f"{chapter}.ipynb", root / f"{chapter}.ipynb")
    _deck(root, "deck", [setup(300)])
    # the negative control waits for its run to end: a short one sends the same kinds of messages
    _deck(root, "deck_dropping", [DROP_THREAD_MESSAGES + "\n\n" + setup(60)])
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    env = {"DSGD_SMOKE": "1", "DSGD_SHAPED_HOSTS": "0"}
    with jupyter_lab(root, tmp / "lab", env, start_timeout=300) as server, chromium(tmp / "profile") as browser:
        yield server, browser
        server.shutdown_kernels()


def _open_classic(server, browser, name: str):  # noqa: ANN001, ANN202 - playwright Page
    page = browser.new_page()
    page.goto(f"{server.url}/nbclassic/notebooks/{name}.ipynb?token={server.token}", timeout=180_000)
    page.wait_for_function(
        "() => window.Jupyter && Jupyter.notebook && Jupyter.notebook._fully_loaded && Jupyter.notebook.kernel"
        " && Jupyter.notebook.kernel.is_connected()", timeout=180_000)  # fmt: skip
    # The widget manager asks the kernel for its widgets when it connects and re-renders every widget output when
    # the answer comes; cells run before that lose their views. The kernel answers shell messages in order, so
    # once a trivial execution has replied, the answer has arrived (a person waits for the kernel indicator).
    page.evaluate("""() => new Promise(done => Jupyter.notebook.kernel.execute('None', {shell: {reply: done}}))""")
    page.wait_for_timeout(1000)
    return page


def _panel_cell(path: Path) -> int:
    """The index of the last code cell that shows a panel (its last line is `panel`)."""
    cells = nbformat.read(path, as_version=4).cells
    shown = [i for i, c in enumerate(cells) if c.cell_type == "code" and c.source.strip()
             and c.source.strip().splitlines()[-1].strip() == "panel"]
    assert shown, f"{path.name} has no cell that shows a panel"
    return shown[-1]


def _setup_and_panel_cells(path: Path) -> list[int]:
    """The code cells a lecturer needs for the panel: the opening ones (up to the first markdown cell after code:
    the client and imports) and those of the panel's section (from its slide's heading to the cell showing it)."""
    cells, shown = nbformat.read(path, as_version=4).cells, _panel_cell(path)
    code = [i for i, c in enumerate(cells) if c.cell_type == "code"]
    first_prose = next((i for i in range(code[0], len(cells)) if cells[i].cell_type == "markdown"), len(cells))
    heading = max((i for i in range(shown) if cells[i].cell_type == "markdown"
                   and cells[i].metadata.get("slideshow", {}).get("slide_type") == "slide"), default=-1)
    return sorted({i for i in code if i < first_prose or heading < i <= shown})


def _run_cells(page, cells: list[int], timeout_s: float = 420) -> None:  # noqa: ANN001
    """Run these cells in order, as a lecturer would with Shift+Enter, and wait until each has run."""
    page.evaluate("(cells) => { window.__dsgdCells = cells; Jupyter.notebook.execute_cells(cells); }", cells)
    page.wait_for_function(
        """() => !Jupyter.notebook.kernel_busy && window.__dsgdCells.every(
            i => typeof Jupyter.notebook.get_cell(i).input_prompt_number === 'number')""",
        timeout=timeout_s * 1000, polling=500)  # fmt: skip
    errors = page.locator(".output_error").all_text_contents()
    assert not errors, f"a cell raised: {errors[0][:2000]}"


# True when the panel's cell is on the slide being shown and, if it is a fragment, the fragment has been revealed
CELL_SHOWN = """(i) => { const cell = Jupyter.notebook.get_cell(i).element[0];
    const slide = document.querySelector('.reveal .slides section.present:not(.stack)');
    const fragment = cell.closest('.fragment');
    return !!slide && slide.contains(cell) && (!fragment || fragment.classList.contains('visible')); }"""


def _present_until_panel(page, cell: int):  # noqa: ANN001, ANN202 - playwright Locator
    """Enter RISE (Alt+R) at the first slide and press Space until the panel's cell shows; return its Run button.

    The widget manager draws a panel after its cell has run (and again once it has the kernel's widgets), so the
    deck is presented only once the Run button is on the page: pressed earlier, Space could pass the panel's slide
    before the panel was drawn on it. On the panel's slide the button is waited for, not judged at one instant: a
    loaded machine can be redrawing the widget just then."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    page.locator(".widget-hbox > button", has_text=RUN_BUTTON).first.wait_for(state="visible", timeout=120_000)
    page.keyboard.press("Escape")
    page.evaluate("() => Jupyter.notebook.select(0)")
    page.keyboard.press("Alt+r")
    page.wait_for_selector("body.rise-enabled .reveal.ready", timeout=60_000)
    run = page.locator(".reveal .slides section.present:not(.stack) .widget-hbox > button", has_text=RUN_BUTTON)
    at_end = "() => Reveal.isLastSlide() && !Reveal.availableFragments().next"
    for _ in range(300):
        if page.evaluate(CELL_SHOWN, cell):
            try:
                run.first.wait_for(state="visible", timeout=60_000)
            except PlaywrightTimeout as e:
                raise AssertionError(f"the panel's slide (cell {cell}) showed no Run button within 60 s") from e
            page.wait_for_timeout(1500)  # let the slide transition end before judging where the button is
            box, height = run.first.bounding_box(), page.viewport_size["height"]
            assert box and 0 <= box["y"] and box["y"] + box["height"] <= height, f"Run is off the slide: {box}"
            return run.first
        assert not page.evaluate(at_end), f"the deck's last slide came and no slide showed the panel's cell {cell}"
        page.keyboard.press("Space")
        page.wait_for_timeout(100)
    raise AssertionError("pressed Space 300 times and no slide showed the panel's cell")  # pragma: no cover


def _kernel_says(page, code: str, timeout_s: float) -> str:  # noqa: ANN001
    """Run code in the notebook's kernel (not through a cell) and return what it printed, or its error."""
    page.evaluate("""(code) => { const out = window.__dsgdSaid = {text: '', reply: null};
        Jupyter.notebook.kernel.execute(code, {shell: {reply: m => { out.reply = m.content.status; }},
            iopub: {output: m => { out.text += m.content.text || `${m.content.ename || ''}: ${m.content.evalue || ''}`; }}},
            {silent: false, store_history: false}); }""", code)  # fmt: skip
    page.wait_for_function("() => window.__dsgdSaid.reply && (window.__dsgdSaid.text.endsWith('\\n') || "
                           "window.__dsgdSaid.reply !== 'ok')", timeout=timeout_s * 1000, polling=250)
    return page.evaluate("() => window.__dsgdSaid.text")


def _run_panel_on_slide(page, run, timeout_s: float = PANEL_TIMEOUT_S) -> tuple[str, str, bytes, bytes]:  # noqa: ANN001
    """Change a control and click Run on the current slide; the status reached, what changed, figure before/after."""
    panel = run.locator("xpath=../..")
    canvas = panel.locator(".jupyter-matplotlib-canvas-div").first
    canvas.wait_for(timeout=60_000)
    before = canvas.screenshot()
    changed = change_a_control(panel)
    status = run.locator("xpath=..").locator(".widget-html-content").first
    run.click()
    deadline, text = time.monotonic() + timeout_s, ""
    while time.monotonic() < deadline:
        text = status.text_content() or ""
        if re.match(r"(Done|Stopped|Failed)", text):
            break
        time.sleep(0.5)
    after, deadline = canvas.screenshot(), time.monotonic() + (30 if text.startswith("Done") else 0)
    while (after == before or _is_blank(after)) and time.monotonic() < deadline:
        time.sleep(0.5)
        after = canvas.screenshot()
    return text, changed, before, after


def _still_presenting(page) -> bool:  # noqa: ANN001
    return bool(page.evaluate("() => document.body.classList.contains('rise-enabled')"))


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_a_chapter_panel_runs_inside_a_rise_slideshow(slides, chapter: str) -> None:  # noqa: ANN001
    server, browser = slides
    page = _open_classic(server, browser, chapter)
    try:
        _run_cells(page, _setup_and_panel_cells(COURSE_DIR / f"{chapter}.ipynb"))
        run = _present_until_panel(page, _panel_cell(COURSE_DIR / f"{chapter}.ipynb"))
        page.screenshot(path=str(SCREENSHOTS / f"slides_{chapter}_panel_slide.png"))
        text, changed, before, after = _run_panel_on_slide(page, run)
        page.screenshot(path=str(SCREENSHOTS / f"slides_{chapter}.png"))
        assert text.startswith("Done"), f"{chapter}: panel status in slide mode is {text!r} after changing {changed}"
        errors = [e for e in run.locator("xpath=../..").locator(".dsgd-error").all_text_contents() if e.strip()]
        assert not errors, f"{chapter}: the panel shows an error in slide mode: {errors}"
        assert after != before and not _is_blank(after), f"{chapter}: the live figure did not update in slide mode"
        assert _still_presenting(page), f"{chapter}: the run left slide mode"
    except Exception:
        page.screenshot(path=str(SCREENSHOTS / f"slides_{chapter}_failure.png"))
        raise
    finally:
        server.shutdown_kernels()
        page.close()


def test_the_check_fails_when_thread_messages_are_dropped(slides) -> None:  # noqa: ANN001
    """With the run thread's comm messages dropped, the kernel reports the run done while the slide still shows it
    running and the figure never changes."""
    server, browser = slides
    page = _open_classic(server, browser, "deck_dropping")
    try:
        _run_cells(page, [0], timeout_s=180)
        run = _present_until_panel(page, 0)
        panel = run.locator("xpath=../..")
        canvas = panel.locator(".jupyter-matplotlib-canvas-div").first
        canvas.wait_for(timeout=60_000)
        before = canvas.screenshot()
        status = run.locator("xpath=..").locator(".widget-html-content").first
        run.click()
        page.wait_for_function("(el) => /^Running/.test(el.textContent)", arg=status.element_handle(),
                               timeout=60_000)  # the click, answered from the kernel's main thread
        said = _kernel_says(page, f"print(panel.wait({PANEL_TIMEOUT_S}) is not None, panel.status.value)",
                            PANEL_TIMEOUT_S + 30)
        assert said.startswith("True Done"), f"the run did not end well in the kernel: {said!r}"
        deadline, text = time.monotonic() + SETTLE_S, ""
        while time.monotonic() < deadline and not (text := status.text_content() or "").startswith("Done"):
            time.sleep(0.25)
        assert text.startswith("Running"), f"status {text!r}: the thread's messages were not dropped"
        assert canvas.screenshot() == before, "the figure changed although the thread's frames were dropped"
        assert _still_presenting(page)
    finally:
        server.shutdown_kernels()
        page.close()


def test_panel_runs_inside_a_jupyterlab_rise_slideshow(slides) -> None:  # noqa: ANN001
    """The same checks in JupyterLab's /rise/ page; an expected failure while jupyterlab-rise cannot load widgets."""
    server, browser = slides
    page = browser.new_page()
    try:
        page.goto(f"{server.url}/rise/deck.ipynb?token={server.token}", timeout=180_000)
        deck = page.locator(".jp-NotebookPanel.reveal.ready")
        deck.wait_for(timeout=180_000)
        current = page.locator(".reveal .slides section.present")
        editor = current.locator(".jp-CodeCell .cm-content").first
        editor.wait_for(timeout=60_000)
        page.wait_for_function(  # a kernel to run the cell on
            "() => !/No Kernel|Connecting|Starting/i.test(document.body.innerText)", timeout=180_000)
        editor.click()
        page.keyboard.press("Control+Enter")  # run in place: Shift+Enter would move on to the next slide
        run = current.locator(".widget-hbox > button", has_text=RUN_BUTTON)
        as_text = current.locator(".jp-OutputArea-output[data-mime-type='text/plain']", has_text="ExperimentPanel(")
        run.first.or_(as_text.first).wait_for(timeout=240_000)
        if as_text.count() and not run.count():
            page.screenshot(path=str(SCREENSHOTS / "slides_jupyterlab_rise_panel_as_text.png"))
            pytest.xfail("jupyterlab-rise shows the panel as its text repr: its bundled JupyterLab core does not load "
                         "the installed widget manager (jupyterlab-contrib/rise#126)")
        text, changed, before, after = _run_panel_on_slide(page, run.first)
        assert text.startswith("Done"), f"panel status in slide mode is {text!r} after changing {changed}"
        assert after != before and not _is_blank(after), "the live figure did not update in slide mode"
        assert "ready" in (deck.get_attribute("class") or ""), "the run left slide mode"
    except Exception:
        page.screenshot(path=str(SCREENSHOTS / "slides_jupyterlab_rise_failure.png"))
        raise
    finally:
        server.shutdown_kernels()
        page.close()
