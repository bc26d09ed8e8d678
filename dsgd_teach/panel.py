"""A reusable widget panel: controls bound to config fields, Run/Stop, a live ipympl figure, errors in view.

The run executes in a background thread, so the kernel stays responsive and Stop works: the panel's on_update
callback raises StopRequested once Stop is clicked, and every run() returns a partial result when that happens.
"""

from __future__ import annotations

import base64
import html
import io
import os
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import ipywidgets as widgets
from distributed import Client
from matplotlib.figure import Figure

from .config import Config
from .live_canvas import live_figure
from .plots import plot_live
from .runtime.clusters.workers import get_workers
from .trace import Result, StopRequested, to_frame

RunFn = Callable[[Any, Client, Any], Result]
W = TypeVar("W", bound=widgets.Widget)
PlotFn = Callable[[Figure, Any], None]
#: Set for the kernels that `make course` runs: every panel a cell builds then runs its settings once when the cell
#: ends and leaves a static figure of that run beneath it, for readers where the live widget cannot render; every
#: other widget a cell shows leaves a static copy of its state (leave_static, or static_copy for any widget).
SNAPSHOT_ENV = "DSGD_PANEL_SNAPSHOT"
SNAPSHOT_TIMEOUT_S = 900.0
#: The CSS class of every static copy's caption: the book styles it, its tests count it.
SNAPSHOT_CLASS = "dsgd-panel-snapshot"
#: What the post-cell hook shows: panels to run and draw, or a widget's static copy (a function of no arguments).
_pending_snapshots: list[ExperimentPanel | Callable[[], list[Any]]] = []


class ExperimentPanel(widgets.VBox):
    """Controls for some config fields, Run and Stop buttons, a live plot and a status/error area."""

    def __init__(
        self,
        client: Client,
        run: RunFn,
        config: Config,
        controls: Mapping[str, widgets.ValueWidget] | None = None,
        plot: PlotFn | None = None,
        *,
        resize_cluster: bool = True,
        title: str | None = None,
        figsize: tuple[float, float] = (9.5, 3.4),
        redraw_every_s: float = 0.3,
    ) -> None:
        self.client, self.run_fn, self.base_config = client, run, config
        self.controls = dict(controls or {})
        unknown = [name for name in self.controls if name not in config.as_dict()]
        if unknown:
            raise ValueError(f"controls {unknown} are not fields of {type(config).__name__}")
        self.plot_fn = plot or plot_live
        self.resize_cluster = resize_cluster
        self.redraw_every_s = redraw_every_s
        self.result: Result | None = None
        self.error: str | None = None
        self._events: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._done = threading.Event()
        self._done.set()
        self._last_draw = 0.0
        self._live = True
        self._thread: threading.Thread | None = None

        self.run_button = widgets.Button(description="Run", button_style="success", icon="play")
        self.stop_button = widgets.Button(description="Stop", button_style="danger", icon="stop", disabled=True)
        self.status = widgets.HTML("Ready.")
        self.summary = widgets.HTML("")
        self.error_box = widgets.HTML("")
        self._draw_lock = threading.RLock()
        self.figure, self.canvas = live_figure(figsize, self._draw_lock)
        self.run_button.on_click(lambda _: self.start())
        self.stop_button.on_click(lambda _: self.stop())
        header = [widgets.HTML(f"<b>{html.escape(title)}</b>")] if title else []
        control_box = widgets.Box(
            list(self.controls.values()), layout=widgets.Layout(flex_flow="row wrap")
        )
        super().__init__(
            [*header, control_box, widgets.HBox([self.run_button, self.stop_button, self.status]), self.canvas,
             self.summary, self.error_box]
        )
        self.panel_title = title
        _register_snapshot(self)

    def current_config(self) -> Config:
        """The base config with the controls' current values (raises ValueError for a bad combination)."""
        return self.base_config.replace(**{name: w.value for name, w in self.controls.items()})

    @property
    def running(self) -> bool:
        return not self._done.is_set()

    def start(self, live: bool = True) -> None:
        """Start a run with the current control values in a background thread (what the Run button does).

        With live=False the figure is drawn once, when the run ends (a snapshot's run, which nobody watches).
        """
        if self.running:
            return
        self._live = live
        self._show_error(None)
        try:
            config = self.current_config()
        except ValueError as exc:
            self._show_error(f"Invalid settings: {exc}")
            return
        self._events, self.result = [], None
        self._stop.clear()
        self._done.clear()
        self.run_button.disabled, self.stop_button.disabled = True, False
        self.status.value = "Running&hellip;"
        self._thread = threading.Thread(target=self._run, args=(config,), name="dsgd-panel-run", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Ask the running experiment to stop (what the Stop button does)."""
        if self.running:
            self._stop.set()
            self.status.value = "Stopping&hellip;"

    def wait(self, timeout: float | None = None) -> Result | None:
        """Block until the current run ends (for tests and scripts); returns the result, None on error."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"run still going after {timeout} s")
        return self.result

    def _run(self, config: Config) -> None:
        t0 = time.perf_counter()
        try:
            if self.resize_cluster and hasattr(config, "workers"):
                if getattr(self.client, "_owned_cluster", None) is not None:  # the course's own: exactly N
                    self.status.value = html.escape(self.client.resize(int(config.workers)))
                else:
                    self.status.value = html.escape(str(get_workers(self.client, int(config.workers))))
            self.result = self.run_fn(config, self.client, self._on_update)
            self._redraw(force=True)
            state = "Stopped" if self.result.stopped else "Done"
            self.status.value = f"{state} in {time.perf_counter() - t0:.1f} s."
            self.summary.value = _summary_html(self.result)
        except Exception as exc:  # shown in the panel, where the user looks
            self.status.value = "Failed."
            self._show_error(f"{type(exc).__name__}: {exc}", traceback.format_exc())
        finally:
            self.run_button.disabled, self.stop_button.disabled = False, True
            self._done.set()

    def _on_update(self, event: dict[str, Any]) -> None:
        self._events.append(event)
        if self._stop.is_set():
            raise StopRequested("stopped from the panel")
        if self._live:
            self._redraw()

    def _redraw(self, force: bool = False) -> None:
        if not force and time.monotonic() - self._last_draw < self.redraw_every_s:
            return
        trace = self.result.trace if (force and self.result is not None) else to_frame(list(self._events))
        with self._draw_lock:
            try:
                self.plot_fn(self.figure, trace)
            except Exception as exc:
                self._show_error(f"plot failed: {type(exc).__name__}: {exc}", traceback.format_exc())
                return
            self.canvas.draw_idle()
        self._last_draw = time.monotonic()  # measured after drawing, so slow draws cannot starve the run

    def snapshot_png(self) -> bytes:
        """The panel's figure as it stands (the last run's, once it has ended) as PNG bytes."""
        buffer = io.BytesIO()
        with self._draw_lock:
            self.figure.savefig(buffer, format="png")
        return buffer.getvalue()

    def snapshot_caption(self) -> str:
        """HTML naming what the static figure shows: the settings, the outcome and the run's summary."""
        settings = ", ".join(f"{name} = {w.value!r}" for name, w in self.controls.items()) or "its defaults"
        outcome = html.escape(self.error) if self.error else self.status.value
        css = f"{SNAPSHOT_CLASS} dsgd-error" if self.error else SNAPSHOT_CLASS
        return (
            f"<div class='{css}'><p><b>{html.escape(self.panel_title or 'Panel')}</b>, static figure of its last run "
            f"({html.escape(settings)}): {outcome} The live panel runs in the notebook (Binder or "
            f"<code>make lab</code>).</p>{self.summary.value}</div>"
        )

    def _show_error(self, message: str | None, details: str | None = None) -> None:
        self.error = message
        if message is None:
            self.error_box.value = ""
            return
        more = f"<details><summary>traceback</summary><pre>{html.escape(details)}</pre></details>" if details else ""
        self.error_box.value = (
            f'<div class="dsgd-error" style="color:#a00;border:1px solid #a00;padding:4px">'
            f"{html.escape(message)}{more}</div>"
        )


def _register_snapshot(item: ExperimentPanel | Callable[[], list[Any]]) -> None:
    """Under SNAPSHOT_ENV in IPython: queue a panel (or a static copy) for display once the cell that built it ends."""
    if _install_hook():
        _pending_snapshots.append(item)


def _install_hook() -> bool:
    """Under SNAPSHOT_ENV in IPython: register the post-cell hook once; whether it is registered."""
    if os.environ.get(SNAPSHOT_ENV) != "1":
        return False
    from IPython import get_ipython

    shell = get_ipython()
    if shell is None:
        return False
    if _show_snapshots not in shell.events.callbacks["post_run_cell"]:
        shell.events.register("post_run_cell", _show_snapshots)
    return True


def leave_static(widget: W, title: str, render: Callable[[], list[Any]] | None = None) -> W:
    """Return widget; under SNAPSHOT_ENV, once the cell that built it ends, show a static copy of it beneath it.

    render returns the objects to display (figures first, then an HTML caption with SNAPSHOT_CLASS); by default,
    static_copy of the widget's state as the cell left it.
    """
    _register_snapshot(render or (lambda: static_copy(widget, title)))
    return widget


def static_caption(title: str, what: str, settings: Mapping[str, Any], body: str = "") -> str:
    """HTML naming a static copy: the widget, what the copy shows, its settings, then body (a table, a summary)."""
    shown = ", ".join(f"{name} = {value!r}" for name, value in settings.items()) or "its defaults"
    return (f"<div class='{SNAPSHOT_CLASS}'><p><b>{html.escape(title)}</b>, static copy of {html.escape(what)} "
            f"({html.escape(shown)}). The live widget runs in the notebook (Binder or <code>make lab</code>).</p>"
            f"{body}</div>")


def static_copy(widget: widgets.Widget, title: str = "A widget") -> list[Any]:
    """Any widget's state as display objects: its pictures (Image widgets, images in Output widgets) as PNGs, then a
    caption with its controls' values and its HTML text (tables)."""
    from IPython.display import HTML, Image

    settings: dict[str, Any] = {}
    pictures: list[Any] = []
    texts: list[str] = []

    def walk(w: widgets.Widget) -> None:
        if isinstance(w, widgets.Image) and w.value:
            pictures.append(Image(data=bytes(w.value), format=w.format))
        elif isinstance(w, (widgets.HTML, widgets.HTMLMath)):
            texts.append(w.value)
        elif isinstance(w, widgets.Output):
            for out in w.outputs:
                data = out.get("data", {})
                if "image/png" in data:
                    pictures.append(Image(data=base64.b64decode(data["image/png"]), format="png"))
                elif "text/html" in data:
                    texts.append(data["text/html"])
        elif isinstance(w, widgets.ValueWidget) and not isinstance(w, (widgets.Label, widgets.Play)):
            settings[w.description or type(w).__name__] = w.value
        for child in getattr(w, "children", ()):
            walk(child)

    walk(widget)
    return [*pictures, HTML(static_caption(title, "its state as the cell left it", settings, "".join(texts)))]


def _show_snapshots(result: Any = None) -> None:
    """IPython's post_run_cell hook: run each queued panel that has not run, then show its figure and caption; show
    each queued static copy. A cell whose value is a widget and that queued nothing leaves static_copy of it."""
    from IPython.display import HTML, Image, display

    shown = bool(_pending_snapshots)
    while _pending_snapshots:
        item = _pending_snapshots.pop(0)
        if not isinstance(item, ExperimentPanel):
            display(*item())
            continue
        panel = item
        if panel.result is None and not panel.running:
            panel.start(live=False)
        panel.wait(SNAPSHOT_TIMEOUT_S)
        display(Image(data=panel.snapshot_png(), format="png"), HTML(panel.snapshot_caption()))
    value = getattr(result, "result", None)
    own_figure = isinstance(value, ExperimentPanel) or hasattr(value, "figure")  # a panel, or ipympl's PNG of itself
    if not shown and isinstance(value, widgets.Widget) and not own_figure:
        display(*static_copy(value))


def _summary_html(result: Result) -> str:
    """The run's summary as items that wrap onto more lines, so a narrow panel never cuts figures off."""
    items = "".join(
        f"<div style='min-width:8em'><b>{html.escape(k)}</b><br>"
        f"{f'{v:.4g}' if isinstance(v, float) else html.escape(str(v))}</div>"
        for k, v in result.summary.items()
    )
    return f"<div class='dsgd-summary' style='display:flex;flex-wrap:wrap;gap:4px 16px;max-width:100%'>{items}</div>"


_install_hook()  # a kernel under SNAPSHOT_ENV: widgets shown as a cell's value leave static copies (static_copy)
