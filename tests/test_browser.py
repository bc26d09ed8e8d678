"""Every chapter in a real browser: JupyterLab in headless Chromium runs the cells and clicks a panel's Run.

What is checked is what a person would see: no error output in any cell and no error from the kernel, a working
dask dashboard link under the first code cell (direct and through jupyter-server-proxy), a panel whose run, started
by a click after a control is changed, draws its live figure (the pixels change) and ends when Stop is clicked.
Screenshots go to build/screenshots/ for people to look at.

The chapters run as a learner on Binder runs them: full mode (their default settings), every panel run once as the
cell that builds it ends (panel.py's snapshot, the static figure the book shows), no emulated hosts (Binder gives no
root). Meanwhile the kernel and everything it starts are held to Binder's 2 GiB (tests/memory_support.py), and the
executed chapter, read from JupyterLab's own notebook model, is what tests/test_book.py builds the book from.
Smoke mode runs every chapter too, on a CLI deployment (tests/test_external_deployment.py).
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import nbformat
import psutil
import pytest
from book_support import executed_dir
from browser_support import chromium, chromium_missing_reason, jupyter_lab
from memory_support import STEP_BYTES, MiB, TreeMemory, budget_for_build, record_peak

from dsgd_teach.course_runner import COURSE_DIR, chapters, record_run, write_executed
from dsgd_teach.memory import torch_build
from dsgd_teach.static_copy import SNAPSHOT_ENV

SCREENSHOTS = COURSE_DIR.parent / "build" / "screenshots"
CHAPTERS = chapters()
MAX_PANELS = 1  # every panel already ran once in the kernel (its snapshot); the browser checks one per chapter
RUN_CELLS_TIMEOUT_S = 900  # full mode on a loaded 2-core machine: the slowest chapter took 215 s under CI's load
PANEL_TIMEOUT_S = 240
#: The kernel's environment: a learner on Binder (full mode, no root for emulated hosts), panels snapshotted once.
FULL_MODE = {"DSGD_SMOKE": "0", SNAPSHOT_ENV: "1", "DSGD_SHAPED_HOSTS": "0"}

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
    if (t === 'error') window.__dsgdErrors.push(
      `kernel error (handling a ${msg.parent_header.msg_type}): ${c.ename}: ${c.evalue}\\n` +
      (c.traceback || []).join('\\n').replace(/\\x1b\\[[0-9;]*m/g, '').slice(-3000));
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

    def notebook(self) -> nbformat.NotebookNode:
        """The notebook as JupyterLab holds it now, outputs included (nothing is saved to disk)."""
        model = self.page.evaluate(_js(_FIND + "return w.context.model.toJSON();"), self.name)
        for cell in model["cells"]:  # JupyterLab writes absent attachments as null; the format omits them
            if "attachments" in cell and cell["attachments"] is None:
                del cell["attachments"]
        nb = nbformat.from_dict(model)
        nbformat.validate(nb)
        return nb

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
    """Change a control, click Run, see the live figure's pixels change, click Stop, and see the run end cleanly.

    The full-size run the panel would go on with already ran in the kernel, for its snapshot, when the cell ended; a
    lecturer's Stop is what ends this one (or Done, where the run finished first).
    """
    panel.scroll_into_view_if_needed()
    canvas = panel.locator(".jupyter-matplotlib-canvas-div").first
    assert canvas.count(), f"{chapter.name}: panel {index} shows no live figure"
    buttons = panel.locator("xpath=./div[contains(@class,'widget-hbox')]")
    run_button = buttons.locator("xpath=./button[normalize-space()='Run']")
    stop_button = buttons.locator("xpath=./button[normalize-space()='Stop']")
    status = run_button.locator("xpath=..").locator(".widget-html-content").first
    shown, deadline = "", time.monotonic() + 30
    while not shown.strip() and time.monotonic() < deadline:  # JupyterLab renders an output once it is in view
        time.sleep(0.2)
        shown = status.text_content() or ""  # "Ready.", or "Done in …" where the panel's snapshot ran it
    assert shown.strip(), f"{chapter.name}: panel {index}'s status never rendered"
    before = canvas.screenshot()
    changed = change_a_control(panel)
    t0 = time.monotonic()
    run_button.click()
    deadline = t0 + PANEL_TIMEOUT_S
    text, started, after, stop_clicked_s = shown, False, before, None
    while time.monotonic() < deadline:  # this run's start (a new status or the button disabled), then its end
        disabled = run_button.is_disabled()  # set before the status changes, cleared after the run's last status
        started = started or text != shown or disabled
        if started and not disabled and re.match(r"(Done|Stopped|Failed)", text):
            break
        if started and stop_clicked_s is None:
            after = canvas.screenshot()
            if after != before and not _is_blank(after):  # the run is drawing: a lecturer has seen enough
                stop_button.click(force=True, timeout=10_000)  # a no-op where the run just ended
                stop_clicked_s = round(time.monotonic() - t0, 1)
        time.sleep(0.5 if started else 0.05)  # a run takes seconds: polled this often, its start is never missed
        text = status.text_content() or ""
    assert started, f"{chapter.name}: panel {index} never started a run after Run was clicked (status {text!r})"
    errors = [e for e in panel.locator(".dsgd-error").all_text_contents() if e.strip()]
    assert not errors, f"{chapter.name}: panel {index} shows an error after changing {changed}: {errors}"
    kernel_errors = chapter.page.evaluate("() => window.__dsgdErrors")
    assert not kernel_errors, f"{chapter.name}: panel {index} run raised in the kernel: {kernel_errors}"
    assert text.startswith(("Done", "Stopped")), (
        f"{chapter.name}: panel {index} status is {text!r} after {PANEL_TIMEOUT_S} s")
    seconds = time.monotonic() - t0
    deadline = time.monotonic() + 30
    while (after == before or _is_blank(after)) and time.monotonic() < deadline:
        time.sleep(0.5)
        after = canvas.screenshot()
    assert after != before, f"{chapter.name}: panel {index}'s figure did not change after Run ({changed})"
    assert not _is_blank(after), f"{chapter.name}: panel {index}'s figure is blank after Run"
    assert stop_button.is_disabled() and run_button.is_enabled(), (
        f"{chapter.name}: panel {index}'s buttons after {text!r}")
    panel.screenshot(path=str(SCREENSHOTS / f"{chapter.stem}_panel{index}.png"))
    return {"changed": changed, "status": text, "run_s": round(seconds, 1), "stop_clicked_s": stop_clicked_s}


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
    """JupyterLab on course/ in full mode, and a fresh headless Chromium (both stopped after the module)."""
    reason = chromium_missing_reason()
    if reason:
        pytest.skip(reason)
    work = tmp_path_factory.mktemp("lab")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with jupyter_lab(COURSE_DIR, work, FULL_MODE) as server, chromium(work / "profile") as browser:
        yield server, browser


def _kernels(server) -> set[int]:  # noqa: ANN001 - browser_support.LabServer
    """The pids of the server's kernel processes."""
    with contextlib.suppress(psutil.NoSuchProcess):
        return {p.pid for p in psutil.Process(server.proc.pid).children()
                if "ipykernel" in " ".join(p.cmdline())}
    return set()


def _check_memory(path: Path, sampler: TreeMemory, seconds: float) -> None:
    """Record the chapter's peaks in build/memory/peaks.json and hold them to Binder's budget."""
    assert sampler.samples > 0, "the memory sampler never ran"
    entry = {"peak_pss_mib": round(sampler.peak_pss / MiB), "peak_rss_sum_mib": round(sampler.peak_rss / MiB),
             "max_processes": sampler.peak_procs, "samples": sampler.samples, "seconds": round(seconds, 1)}
    record_peak(path.stem, entry)
    print(f"{path.stem}: {entry}")
    budget = budget_for_build(sampler.peak_procs)
    assert sampler.peak_pss + STEP_BYTES <= budget, (  # the sampler reads a peak to within STEP_BYTES
        f"{path.name}: kernel + cluster peaked at {sampler.peak_pss / MiB:.0f} MiB PSS "
        f"(RSS sum {sampler.peak_rss / MiB:.0f} MiB), over the {budget / MiB:.0f} MiB budget ({torch_build()} build)"
    )


@pytest.mark.browser
@pytest.mark.notebook
@pytest.mark.timeout(1500)
@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_in_jupyterlab(path, lab, monkeypatch):
    server, browser = lab
    page = browser.new_page()
    chapter = Chapter(page, server, path)
    original = path.read_bytes()
    t0, log_start = time.monotonic(), server.log_size()
    timings: dict[str, object] = {}
    sampler: TreeMemory | None = None
    try:
        before = _kernels(server)
        chapter.open()
        kernel = _kernels(server) - before
        assert len(kernel) == 1, f"{path.name}: expected one new kernel process, found {sorted(kernel)}"
        sampler = TreeMemory(kernel.pop())
        sampler.start()
        n_cells = len(chapter.state()["cells"])
        started = datetime.now(timezone.utc)
        chapter.run("notebook:run-all-above", n_cells - 1)  # everything but the last cell, client.close()
        state = chapter.wait_cells(n_cells - 1, RUN_CELLS_TIMEOUT_S)
        server.remember_processes()
        sampler.stop()
        timings["cells_s"] = round(time.monotonic() - t0, 1)
        executed = chapter.notebook()  # before the panels below change their figures: what the book shows
        monkeypatch.setenv("DSGD_SMOKE", "0")  # the run's mode, as record_run reads it
        record_run(executed, started, timings["cells_s"])
        write_executed(executed, executed_dir() / path.name)
        errors = chapter.errors(state)
        assert not errors, f"{path.name}: errors shown:\n" + "\n".join(errors)
        assert not chapter.never_ran(state, n_cells - 1), f"{path.name}: cells never ran: {chapter.never_ran(state, n_cells - 1)}"
        _check_memory(path, sampler, timings["cells_s"])
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
        if sampler is not None:
            sampler.stop()
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
