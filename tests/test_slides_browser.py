"""Lecture mode in a real browser: a widget panel inside a RISE slideshow (jupyterlab-rise, the slide mode that
pyproject's `jupyterlab-rise` and the chapters' `slideshow` metadata target), in headless Chromium.

The deck is opened at JupyterLab's /rise/ page, so it is presented by reveal.js from the first moment; its code
cell is run from the slide (Ctrl+Enter), as a lecturer does. Then, without leaving slide mode: the panel renders
on the current slide, a control is changed, Run is clicked, and the status must reach "Done" and the live figure's
pixels must change. Both happen only if what the panel's background run thread sends (widget state and ipympl
frames; ipykernel 7 changed how output from threads is routed) reaches the panel on the slide: with the thread's
messages dropped, the status stays "Running…" and this test fails.

Today it ends as an expected failure at the first check, with the reason: jupyterlab-rise 0.43.1 (the newest on
PyPI) bundles JupyterLab 4.3.4's core, and the widget manager built for the JupyterLab installed here (4.6) does not
load into it ("Unsatisfied version ... of shared singleton module" in the browser console), so every widget is shown
as its text repr on the slide (jupyterlab-contrib/rise#119 and #126). Slides of the chapters without widgets work;
the panels need the notebook view. When a RISE release loads the widget manager, the panel renders and the rest of
the test runs unchanged.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import nbformat
import pytest
from browser_support import chromium, chromium_missing_reason, jupyter_lab
from test_browser import _is_blank, change_a_control

SCREENSHOTS = Path(__file__).resolve().parents[1] / "build" / "screenshots"

SETUP = """\
from dsgd_teach import start_client
from dsgd_teach.panel import ExperimentPanel
from dsgd_teach.sgd import SGDConfig, run_sgd
import ipywidgets as widgets

client = start_client(1, quiet=True, use_gpu=False)
panel = ExperimentPanel(client, run_sgd, SGDConfig(steps=300, eval_every=10), resize_cluster=False,
                        controls={"lr": widgets.Dropdown(options=[0.05, 0.2], value=0.05, description="lr")})
panel"""


def _deck(root: Path) -> Path:
    def cell(kind, source: str, slide: str):  # noqa: ANN001, ANN202
        return kind(source, metadata={"slideshow": {"slide_type": slide}})

    v4 = nbformat.v4
    nb = v4.new_notebook(cells=[cell(v4.new_code_cell, SETUP, "slide"),
                                cell(v4.new_markdown_cell, "## The next slide", "slide")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = root / "deck.ipynb"
    nbformat.write(nb, path)
    return path


@pytest.mark.browser
@pytest.mark.timeout(600)
def test_panel_runs_inside_a_rise_slideshow(tmp_path: Path) -> None:
    reason = chromium_missing_reason()
    if reason:
        pytest.skip(reason)
    root = tmp_path / "deck"
    root.mkdir()
    _deck(root)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with jupyter_lab(root, tmp_path / "lab", {"DSGD_SMOKE": "1"}, start_timeout=300) as server, \
            chromium(tmp_path / "profile") as browser:
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
            run = current.locator(".widget-hbox > button", has_text=re.compile(r"^\s*Run\s*$"))
            as_text = current.locator(".jp-OutputArea-output[data-mime-type='text/plain']",
                                      has_text="ExperimentPanel(")
            run.first.or_(as_text.first).wait_for(timeout=240_000)
            if as_text.count() and not run.count():
                page.screenshot(path=str(SCREENSHOTS / "slides_panel_as_text.png"))
                pytest.xfail("the RISE slideshow shows the panel as its text repr: jupyterlab-rise's bundled "
                             "JupyterLab core does not load the installed widget manager "
                             "(jupyterlab-contrib/rise#126)")
            assert "ready" in (deck.get_attribute("class") or ""), "running the cell left slide mode"
            panel = run.first.locator("xpath=../..")
            canvas = panel.locator(".jupyter-matplotlib-canvas-div").first
            canvas.wait_for(timeout=60_000)
            before = canvas.screenshot()
            changed = change_a_control(panel)
            status = run.first.locator("xpath=..").locator(".widget-html-content").first
            run.first.click()
            deadline, text = time.monotonic() + 180, ""
            while time.monotonic() < deadline:
                text = status.text_content() or ""
                if re.match(r"(Done|Stopped|Failed)", text):
                    break
                time.sleep(0.5)
            page.screenshot(path=str(SCREENSHOTS / "slides_panel.png"))
            assert text.startswith("Done"), f"panel status in slide mode is {text!r} after changing {changed}"
            assert not [e for e in panel.locator(".dsgd-error").all_text_contents() if e.strip()]
            after, deadline = canvas.screenshot(), time.monotonic() + 30
            while (after == before or _is_blank(after)) and time.monotonic() < deadline:
                time.sleep(0.5)
                after = canvas.screenshot()
            assert after != before and not _is_blank(after), "the live figure did not update in slide mode"
            assert page.locator(".reveal .slides section.present").count() == 1
            assert "ready" in (deck.get_attribute("class") or ""), "the run left slide mode"
        except Exception:
            page.screenshot(path=str(SCREENSHOTS / "slides_failure.png"))
            raise
        finally:
            server.shutdown_kernels()
            page.close()
