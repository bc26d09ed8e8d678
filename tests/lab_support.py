"""Driving the course's JupyterLab workspace in a real browser: the chapter beside its three dask panes.

Shared by the `make lab` workspace test and the hub's browser test: JavaScript that reads the page's JupyterLab app
(exposed by `expose_app_in_browser`), a poll that waits inside Playwright, the workspace opened and checked, a
notebook's cells run, and the Bokeh data each dask pane shows.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import urlsplit

PANES = {"Task Stream": "/individual-task-stream", "Progress": "/individual-progress", "Workers": "/individual-workers"}
WAIT_S = 60

FIND = "const w = Array.from(window.jupyterapp.shell.widgets('main')).find(x => x.context && x.context.path === path);"
# JavaScript: the notebook's kernel status and each code cell's execution count and error outputs.
CELLS = FIND + """
  if (!w) return null;
  const k = w.sessionContext.session && w.sessionContext.session.kernel;
  return {kernel: k ? k.status : 'none', cells: w.content.widgets.map((c, i) => ({i, code: c.model.type === 'code',
    count: c.model.type === 'code' ? c.model.executionCount : null,
    errors: c.model.type === 'code' ? c.model.outputs.toJSON().filter(o => o.output_type === 'error')
      .map(o => `cell ${i}: ${o.ename}: ${o.evalue}`) : []}))};
"""
# JavaScript: the text a code cell printed.
PRINTED = FIND + "return w.content.widgets[cell].model.outputs.toJSON().map(o => [].concat(o.text || '').join('')).join('');"
# JavaScript: the notebook's box and every dask pane in the main area (title, box, iframe address).
LAYOUT = FIND + """
  const box = e => { const r = e.getBoundingClientRect(); return {left: r.left, right: r.right, top: r.top,
                                                                  width: r.width, height: r.height}; };
  const panes = Array.from(window.jupyterapp.shell.widgets('main'))
    .filter(x => x.node.classList.contains('dask-DaskDashboard-widget'))
    .map(x => ({title: x.title.label, route: x.item && x.item.route, box: box(x.node),
                src: ((f => f && f.getAttribute('src'))(x.node.querySelector('iframe'))) || ''}));
  const k = w && w.sessionContext.session && w.sessionContext.session.kernel;
  return {notebook: w ? box(w.node) : null, kernel: k ? k.status : 'none',
          current: window.jupyterapp.shell.currentWidget === w, panes};
"""
# JavaScript, inside a pane's iframe: the columns of every Bokeh data source on the page, as strings.
SOURCES = """() => {
  const out = [];
  for (const doc of (window.Bokeh && window.Bokeh.documents) || []) {
    for (const m of doc._all_models ? doc._all_models.values() : []) {
      if (!m.data || typeof m.data !== 'object') continue;
      const cols = {};
      for (const [k, v] of (m.data instanceof Map ? m.data.entries() : Object.entries(m.data)))
        if (Array.isArray(v) || ArrayBuffer.isView(v)) cols[k] = Array.from(v).slice(0, 200).map(String);
      out.push(cols);
    }
  }
  return out;
}"""


def js(body: str) -> str:
    """A page function of the notebook's path running body."""
    return f"(path) => {{ {body} }}"


def wait(page, what: str, check, timeout_s: float = WAIT_S, interval_s: float = 0.5):  # noqa: ANN001, ANN201
    """Poll check() until it returns something true; fail naming `what` (and the last value) after timeout_s.

    It waits inside Playwright (not time.sleep), so the page's routed requests are served meanwhile.
    """
    deadline, value = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        page.wait_for_timeout(interval_s * 1000)
    raise AssertionError(f"{what}: not seen within {timeout_s:.0f} s (last seen: {value!r})")


def open_workspace(page, chapter: str, timeout_s: float) -> dict[str, Any]:  # noqa: ANN001 - playwright Page
    """Wait until `chapter` is open with an idle kernel beside the three dask panes, the chapter the current widget
    and no pane loading a page yet; the layout (the notebook's box, each pane's title, route, box and address)."""
    ready = js("if (!window.jupyterapp || !window.jupyterapp.shell) return null;" + LAYOUT)
    seen: list = []

    def opened() -> dict | None:
        seen[:] = [page.evaluate(ready, chapter)]
        lay = seen[0]
        return lay if lay and lay["kernel"] == "idle" and len(lay["panes"]) == 3 else None

    try:
        layout = wait(page, f"{chapter} open with an idle kernel and three dask panes", opened, timeout_s)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nthe workspace shows: {seen}") from None
    panes = {p["title"]: p for p in layout["panes"]}
    assert {t: p["route"] for t, p in panes.items()} == PANES, layout["panes"]
    assert layout["current"], "the notebook is not the current widget, so the search would not find its kernel"
    assert not any(p["src"] for p in panes.values()), f"panes load a page before any cluster exists: {panes}"
    search = page.locator(".dask-URLInput [title='Auto-detect dashboard URL']")
    assert search.is_visible(), "the Dask side panel (and its search button) is not open"
    return layout


def cells(page, chapter: str) -> dict:  # noqa: ANN001 - playwright Page
    """The chapter's kernel status and each code cell's execution count and errors."""
    return page.evaluate(js(CELLS), chapter)


def run_cells(page, chapter: str, command: str, cell: int, upto: int, timeout_s: float = 120) -> None:  # noqa: ANN001
    """Execute a notebook command at `cell` (what the Run menu does) and wait until code cells < upto have run,
    failing on any error a cell shows."""
    before = {c["i"]: c["count"] for c in cells(page, chapter)["cells"]}
    page.evaluate(js(FIND + f"w.content.activeCellIndex = {cell};"
                     f"void window.jupyterapp.commands.execute('{command}');"), chapter)  # fmt: skip

    def done() -> dict | None:
        state = cells(page, chapter)
        errors = [e for c in state["cells"] for e in c["errors"]]
        assert not errors, f"{chapter}: errors shown:\n" + "\n".join(errors)
        ran = all(c["count"] for c in state["cells"][:upto] if c["code"])
        moved = command != "notebook:run-cell" or state["cells"][cell]["count"] != before[cell]
        return state if state["kernel"] == "idle" and ran and moved else None

    wait(page, f"code cells before {upto} of {chapter} executed", done, timeout_s=timeout_s)


def printed(page, chapter: str, cell: int) -> str:  # noqa: ANN001 - playwright Page
    """The text code cell `cell` of the chapter printed."""
    return page.evaluate("([path, cell]) => { " + PRINTED + " }", [chapter, cell])


def connected_panes(page, chapter: str) -> list | None:  # noqa: ANN001 - playwright Page
    """The three panes once each loads a page (None until then)."""
    panes = page.evaluate(js(LAYOUT), chapter)["panes"]
    return panes if all(p["src"] for p in panes) else None


def pane_data(page, route: str) -> list[dict]:  # noqa: ANN001 - playwright Page
    """The Bokeh data sources the pane at `route` shows (empty until its page loaded)."""
    frame = next((f for f in page.frames if urlsplit(f.url).path.endswith(route)), None)
    try:
        return frame.evaluate(SOURCES) if frame else []
    except Exception:  # the frame is navigating; the next poll sees it
        return []


def column(sources: list[dict], name: str) -> list:
    """Every value of column `name` over the data sources."""
    return [v for src in sources for v in (src.get(name) or [])]
