"""Every chapter in a real browser: JupyterLab in headless Chromium runs the cells and clicks each panel's Run.

What is checked is what a person would see: no error output in any cell, a working dask dashboard link under the
first code cell (direct and through jupyter-server-proxy), a panel that reaches "Done" after a control is changed,
and a live figure whose pixels changed. Screenshots go to build/screenshots/ for people to look at.
"""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from browser_support import chromium, chromium_missing_reason, jupyter_lab

from dsgd_teach.course_runner import COURSE_DIR, chapters

SCREENSHOTS = COURSE_DIR.parent / "build" / "screenshots"
CHAPTERS = chapters()
MAX_PANELS = 3
RUN_CELLS_TIMEOUT_S = 300
PANEL_TIMEOUT_S = 240

# JavaScript: the notebook panel open on `path` (the app is exposed by --LabApp.expose_app_in_browser).
_FIND = "const w = Array.from(window.jupyterapp.shell.widgets('main')).find(x => x.context && x.context.path === path);"
_STATE = _FIND + """
  if (!w) return null;
  const k = w.sessionContext.session && w.sessionContext.session.kernel;
  return {kernel: k ? k.status : 'none', active: w.content.activeCellIndex, cells: w.content.widgets.map((c, i) => {
    const code = c.model.type === 'code';
    return {i, code, count: code ? c.model.executionCount : null, prompt: code ? c.promptNode.textContent : '',
            errors: code ? c.model.outputs.toJSON().filter(o => o.output_type === 'error')
                             .map(o => `cell ${i}: ${o.ename}: ${o.evalue}`) : []};
  })};
"""
_LISTEN = _FIND + """
  window.__dsgdErrors = [];
  const k = w.sessionContext.session.kernel;
  k.iopubMessage.connect((_, msg) => {
    const t = msg.header.msg_type, c = msg.content;
    if (t === 'error') window.__dsgdErrors.push(`kernel error: ${c.ename}: ${c.evalue}`);
    if (t === 'stream' && c.name === 'stderr' && c.text.includes('Traceback')) window.__dsgdErrors.push(c.text);
  });
  w.sessionContext.statusChanged.connect((_, s) => {
    if (s === 'dead' || s === 'restarting') window.__dsgdErrors.push(`kernel ${s}`);
  });
"""
_DOM_ERRORS = _FIND + """
  const out = [...window.__dsgdErrors];
  for (const e of w.content.node.querySelectorAll('[data-mime-type="application/vnd.jupyter.error"]'))
    out.push('error output shown: ' + e.textContent.slice(0, 1500));
  for (const e of w.content.node.querySelectorAll('[data-mime-type="application/vnd.jupyter.stderr"]'))
    if (e.textContent.includes('Traceback')) out.push('traceback shown: ' + e.textContent.slice(0, 1500));
  for (const e of w.content.node.querySelectorAll('.dsgd-error'))
    if (e.textContent.trim()) out.push('panel error shown: ' + e.textContent.slice(0, 1500));
  return out;
"""


def _js(body: str) -> str:
    return f"(path) => {{ {body} }}"


class Chapter:
    """One chapter opened in JupyterLab: run cells, poll state, collect errors."""

    def __init__(self, page, server, path: Path) -> None:  # noqa: ANN001 - playwright/LabServer objects
        self.page, self.server, self.name = page, server, path.name
        self.stem = path.stem

    def state(self) -> dict:
        return self.page.evaluate(_js(_STATE), self.name)

    def open(self, timeout_s: float = 180) -> None:
        url = f"{self.server.url}/lab/workspaces/{self.stem}/tree/{self.name}?reset&token={self.server.token}"
        self.page.goto(url, timeout=timeout_s * 1000)
        ready = (
            "if (!window.jupyterapp || !window.jupyterapp.shell) return false;" + _FIND
            + "const s = w && w.sessionContext.session;"
            + "return !!(s && s.kernel && s.kernel.status === 'idle' && w.content.widgets.length);"
        )
        self.page.wait_for_function(_js(ready), arg=self.name, timeout=timeout_s * 1000, polling=500)
        self.page.evaluate(_js(_LISTEN), self.name)

    def run(self, command: str, cell: int) -> None:
        """Select cell and execute a notebook command (what the Run menu does), without waiting."""
        body = _FIND + f"w.content.activeCellIndex = {cell}; void window.jupyterapp.commands.execute('{command}');"
        self.page.evaluate(_js(body), self.name)

    def wait_cells(self, upto: int, timeout_s: float) -> dict:
        """Wait until the kernel is idle and the code cells before index `upto` ran (or one failed)."""
        deadline, calm, state = time.monotonic() + timeout_s, 0, {}
        while time.monotonic() < deadline:
            time.sleep(1.0)
            state = self.state()
            cells = [c for c in state["cells"][:upto] if c["code"]]
            busy = state["kernel"] != "idle" or any("*" in c["prompt"] for c in state["cells"])
            finished = all(c["count"] is not None for c in cells) or any(c["errors"] for c in cells)
            calm = calm + 1 if (not busy and finished) else 0
            if calm >= 2:
                return state
        pending = [c["i"] for c in state.get("cells", []) if c["code"] and c["count"] is None]
        raise AssertionError(
            f"{self.name}: cells still running after {timeout_s:.0f} s (kernel {state.get('kernel')}, cells not "
            f"run: {pending})\n{self.server.log_tail(30)}"
        )

    def errors(self, state: dict) -> list[str]:
        model = [e for c in state["cells"] for e in c["errors"]]
        return model + self.page.evaluate(_js(_DOM_ERRORS), self.name)

    def never_ran(self, state: dict, upto: int) -> list[int]:
        return [c["i"] for c in state["cells"][:upto] if c["code"] and c["count"] is None]


def _cell_locator(chapter: Chapter, index: int):  # noqa: ANN202 - playwright Locator
    return chapter.page.locator(".jp-Notebook .jp-Cell").nth(index)


def check_dashboard(chapter: Chapter, state: dict) -> str:
    """The first code cell shows a dashboard link that answers, directly and through jupyter-server-proxy."""
    first = next(c["i"] for c in state["cells"] if c["code"])
    links = _cell_locator(chapter, first).locator(".jp-OutputArea-output a[href*='/status']")
    assert links.count() > 0, f"{chapter.name}: no dask dashboard link in the output of cell {first}"
    href = links.first.get_attribute("href")
    resp = chapter.page.request.get(href, timeout=60_000)
    assert resp.ok, f"{chapter.name}: dashboard {href} answered {resp.status}"
    port = re.search(r":(\d+)/", href)
    assert port, f"{chapter.name}: no port in the dashboard link {href}"
    proxied = f"{chapter.server.url}/proxy/{port.group(1)}/status"
    resp = chapter.page.request.get(proxied, timeout=60_000)
    assert resp.ok, f"{chapter.name}: dashboard through jupyter-server-proxy ({proxied}) answered {resp.status}"
    return href


def _is_blank(png: bytes) -> bool:
    import numpy as np
    from PIL import Image

    gray = np.asarray(Image.open(io.BytesIO(png)).convert("L"))
    return int((gray < 200).sum()) < 0.002 * gray.size


def change_a_control(panel) -> str:  # noqa: ANN001 - playwright Locator
    """Change one control like a person would (slider by keyboard, dropdown, checkbox, toggle); say what changed."""
    box = panel.locator("xpath=./div[contains(@class,'widget-box') and not(contains(@class,'widget-hbox'))]").first
    assert box.count(), "the panel shows no controls"
    controls = box.locator(":scope > .jupyter-widgets")
    labels = [controls.nth(i).locator(".widget-label").first.text_content() or "" for i in range(controls.count())]
    costly = ("worker", "replica", "process", "thread", "shard", "backup", "step", "epoch")  # resizing costs time
    order = sorted(range(len(labels)), key=lambda i: any(w in labels[i].lower() for w in costly))
    for i in order:
        ctl, label = controls.nth(i), labels[i]
        if ctl.locator(".noUi-handle").count():
            readout = ctl.locator(".widget-readout")
            before = readout.text_content()
            handle = ctl.locator(".noUi-handle").first
            for key in ("ArrowLeft", "ArrowRight", "ArrowRight"):  # smaller first: usually the cheaper run
                handle.focus()
                handle.press(key)
                if readout.text_content() != before:
                    return f"{label}: {before} -> {readout.text_content()}"
        elif ctl.locator("select").count():
            select = ctl.locator("select").first
            before = select.input_value()
            options = select.locator("option").all_text_contents()
            other = next((o for o in options if o != select.locator("option:checked").text_content()), None)
            if other is not None:
                select.select_option(label=other)
                return f"{label}: {before} -> {select.input_value()}"
        elif ctl.locator("input[type=checkbox]").count():
            ctl.locator("input[type=checkbox]").first.click()
            return f"{label}: toggled"
        elif ctl.locator("button.widget-toggle-button:not(.mod-active)").count():
            target = ctl.locator("button.widget-toggle-button:not(.mod-active)").first
            text = target.text_content()
            target.click()
            return f"{label}: -> {text}"
    raise AssertionError(f"no control of the panel could be changed (controls: {labels})")


def exercise_panel(chapter: Chapter, panel, index: int) -> dict:  # noqa: ANN001 - playwright Locator
    """Change a control, click Run, wait for Done, and check the live figure's pixels changed."""
    panel.scroll_into_view_if_needed()
    canvas = panel.locator(".jupyter-matplotlib-canvas-div").first
    assert canvas.count(), f"{chapter.name}: panel {index} shows no live figure"
    before = canvas.screenshot()
    changed = change_a_control(panel)
    run_button = panel.locator("xpath=./div[contains(@class,'widget-hbox')]/button[normalize-space()='Run']")
    status = run_button.locator("xpath=..").locator(".widget-html-content").first
    t0 = time.monotonic()
    run_button.click()
    deadline = t0 + PANEL_TIMEOUT_S
    text = status.text_content() or ""
    while not re.match(r"(Done|Stopped|Failed)", text) and time.monotonic() < deadline:
        time.sleep(0.5)
        text = status.text_content() or ""
    errors = [e for e in panel.locator(".dsgd-error").all_text_contents() if e.strip()]
    assert not errors, f"{chapter.name}: panel {index} shows an error after changing {changed}: {errors}"
    kernel_errors = chapter.page.evaluate("() => window.__dsgdErrors")
    assert not kernel_errors, f"{chapter.name}: panel {index} run raised in the kernel: {kernel_errors}"
    assert text.startswith("Done"), f"{chapter.name}: panel {index} status is {text!r} after {PANEL_TIMEOUT_S} s"
    seconds = time.monotonic() - t0
    after, deadline = canvas.screenshot(), time.monotonic() + 30
    while (after == before or _is_blank(after)) and time.monotonic() < deadline:
        time.sleep(0.5)
        after = canvas.screenshot()
    assert after != before, f"{chapter.name}: panel {index}'s figure did not change after Run ({changed})"
    assert not _is_blank(after), f"{chapter.name}: panel {index}'s figure is blank after Run"
    panel.screenshot(path=str(SCREENSHOTS / f"{chapter.stem}_panel{index}.png"))
    return {"changed": changed, "status": text, "run_s": round(seconds, 1)}


def full_notebook_screenshot(chapter: Chapter, width: int = 1400, max_height: int = 16000) -> None:
    """The whole chapter in one image: grow the viewport to the notebook's height, then shoot."""
    height = chapter.page.evaluate(
        _js(_FIND + "const o = w.content.node.querySelector('.jp-WindowedPanel-outer') || w.content.node;"
            "o.scrollTop = 0; return o.scrollHeight;"),
        chapter.name,
    )  # fmt: skip
    old = chapter.page.viewport_size
    chapter.page.set_viewport_size({"width": width, "height": min(max_height, int(height) + 200)})
    chapter.page.wait_for_timeout(1500)
    chapter.page.screenshot(path=str(SCREENSHOTS / f"{chapter.stem}_page.png"))
    chapter.page.set_viewport_size(old)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """JupyterLab on course/ in smoke mode, and a fresh headless Chromium (both stopped after the module)."""
    reason = chromium_missing_reason()
    if reason:
        pytest.skip(reason)
    work = tmp_path_factory.mktemp("lab")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with jupyter_lab(COURSE_DIR, work, {"DSGD_SMOKE": "1"}) as server, chromium(work / "profile") as browser:
        yield server, browser


@pytest.mark.browser
@pytest.mark.timeout(600)
@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_in_jupyterlab(path, lab):
    server, browser = lab
    page = browser.new_page()
    chapter = Chapter(page, server, path)
    original = path.read_bytes()
    t0, log_start = time.monotonic(), server.log_size()
    timings: dict[str, object] = {}
    try:
        chapter.open()
        n_cells = len(chapter.state()["cells"])
        chapter.run("notebook:run-all-above", n_cells - 1)  # everything but the last cell, client.close()
        state = chapter.wait_cells(n_cells - 1, RUN_CELLS_TIMEOUT_S)
        server.remember_processes()
        timings["cells_s"] = round(time.monotonic() - t0, 1)
        errors = chapter.errors(state)
        assert not errors, f"{path.name}: errors shown:\n" + "\n".join(errors)
        assert not chapter.never_ran(state, n_cells - 1), f"{path.name}: cells never ran: {chapter.never_ran(state, n_cells - 1)}"
        timings["dashboard"] = check_dashboard(chapter, state)
        run_buttons = page.locator(".jp-OutputArea-output .widget-vbox > .widget-hbox > button", has_text=re.compile(r"^\s*Run\s*$"))
        uses_panel = any("panel" in "".join(c["source"]).lower() for c in json.loads(original)["cells"] if c["cell_type"] == "code")
        assert run_buttons.count() or not uses_panel, f"{path.name}: a panel is created but no Run button is shown"
        panels = [run_buttons.nth(i).locator("xpath=../..") for i in range(min(MAX_PANELS, run_buttons.count()))]
        timings["panels"] = [exercise_panel(chapter, panel, i) for i, panel in enumerate(panels)]
        full_notebook_screenshot(chapter)
        chapter.run("notebook:run-cell", n_cells - 1)
        state = chapter.wait_cells(n_cells, 120)
        errors = chapter.errors(state)
        assert not errors, f"{path.name}: errors after the last cell (client.close()):\n" + "\n".join(errors)
        assert not chapter.never_ran(state, n_cells), f"{path.name}: the last cell did not run"
        logged = server.tracebacks_since(log_start)
        assert not logged, f"{path.name}: tracebacks in the server/kernel log:\n" + "\n".join(logged)
    except Exception:
        page.screenshot(path=str(SCREENSHOTS / f"{path.stem}_failure.png"))
        raise
    finally:
        shutil.copyfile(server.log_path, SCREENSHOTS / "jupyter-lab.log")
        timings["total_s"] = round(time.monotonic() - t0, 1)
        _record_timing(path.stem, timings)
        server.shutdown_kernels()
        page.close()
        _check_not_saved(path, original)


def _check_not_saved(path: Path, original: bytes) -> None:
    """JupyterLab must not save outputs into a committed chapter (an author's own edit meanwhile is left alone)."""
    now = path.read_bytes()
    if now == original:
        return
    try:
        cells = json.loads(now)["cells"]
    except (ValueError, KeyError):
        return  # being written by its author right now
    if any(c.get("outputs") or c.get("execution_count") for c in cells):
        path.write_bytes(original)
        pytest.fail(f"{path.name} was saved with outputs during the browser test (restored)")


def _record_timing(stem: str, timings: dict) -> None:
    out = SCREENSHOTS / "browser_timings.json"
    data = json.loads(out.read_text()) if out.exists() else {}
    data[stem] = timings
    out.write_text(json.dumps(data, indent=1))


def _enabled_ok(text: str, names: list[str]) -> list[str]:
    plain = re.sub(r"\x1b\[[0-9;]*m", "", text)
    return [n for n in names if not re.search(rf"{re.escape(n)}\s+v?\S*\s*enabled\s*(OK|$)", plain, re.M)]


@pytest.mark.timeout(180)
def test_jupyterlab_extras_are_installed_and_enabled():
    """dask-labextension, ipympl, jupyter-server-proxy, RISE and the widget manager, front end and server."""
    jupyter = [sys.executable, "-m", "jupyter"]
    lab = subprocess.run([*jupyter, "labextension", "list"], capture_output=True, text=True, timeout=150)
    lab_text = lab.stdout + lab.stderr
    missing = _enabled_ok(
        lab_text,
        ["dask-labextension", "jupyter-matplotlib", "@jupyterhub/jupyter-server-proxy", "jupyterlab-rise",
         "@jupyter-widgets/jupyterlab-manager"],
    )  # fmt: skip
    assert not missing, f"lab extensions missing or disabled: {missing}\n{lab_text}"
    server = subprocess.run([*jupyter, "server", "extension", "list"], capture_output=True, text=True, timeout=150)
    server_text = re.sub(r"\x1b\[[0-9;]*m", "", server.stdout + server.stderr)
    for name in ("dask_labextension", "jupyter_server_proxy", "jupyterlab_rise"):
        assert re.search(rf"^\s*{name}\s+enabled", server_text, re.M), f"server extension {name} not enabled"
        assert re.search(rf"^\s*{name}\s+\S*\s*OK", server_text, re.M), f"server extension {name} not OK"


LIVE_NOTEBOOK = [
    "from dsgd_teach import start_client\n"
    "from dsgd_teach.panel import ExperimentPanel\n"
    "from dsgd_teach.sgd import SGDConfig, run_sgd\n"
    "client = start_client(1, quiet=True, use_gpu=False)",
    "panel = ExperimentPanel(client, run_sgd, SGDConfig(steps=200_000, eval_every=5), resize_cluster=False)\npanel",
    "client.close()",
]


@pytest.mark.browser
@pytest.mark.timeout(300)
def test_live_figure_keeps_updating_during_a_long_run(lab, tmp_path):
    """A long panel run redraws the figure in the browser again and again (not once, not frozen); Stop works."""
    import nbformat

    _, browser = lab
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(src) for src in LIVE_NOTEBOOK])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    root = tmp_path / "nb"
    root.mkdir()
    nbformat.write(nb, root / "live.ipynb")
    with jupyter_lab(root, tmp_path / "lab", {"DSGD_SMOKE": "1"}) as server:
        page = browser.new_page()
        try:
            chapter = Chapter(page, server, root / "live.ipynb")
            chapter.open()
            chapter.run("notebook:run-all-above", 2)
            state = chapter.wait_cells(2, 180)
            assert not chapter.errors(state), chapter.errors(state)
            run = page.locator(".widget-hbox > button", has_text=re.compile(r"^\s*Run\s*$"))
            panel = run.locator("xpath=../..")
            canvas = panel.locator(".jupyter-matplotlib-canvas-div").first
            status = run.locator("xpath=..").locator(".widget-html-content").first
            run.click()
            seen: list[bytes] = []
            deadline = time.monotonic() + 120
            while len(seen) < 4 and time.monotonic() < deadline:
                time.sleep(0.5)
                shot = canvas.screenshot()
                if not _is_blank(shot) and shot not in seen:
                    seen.append(shot)
                assert not (status.text_content() or "").startswith(("Done", "Failed")), status.text_content()
            panel.locator("button", has_text="Stop").click()
            deadline = time.monotonic() + 60
            while not (status.text_content() or "").startswith(("Stopped", "Done", "Failed")):
                assert time.monotonic() < deadline, "Stop did not end the run within 60 s"
                time.sleep(0.5)
            assert len(seen) >= 4, f"the live figure showed only {len(seen)} distinct frames in 120 s of running"
            assert (status.text_content() or "").startswith("Stopped"), status.text_content()
            assert not chapter.errors(chapter.state()), chapter.errors(chapter.state())
            chapter.run("notebook:run-cell", 2)
            chapter.wait_cells(3, 60)
        except Exception:
            page.screenshot(path=str(SCREENSHOTS / "live_figure_failure.png"))
            raise
        finally:
            page.close()
