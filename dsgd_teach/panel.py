"""A reusable widget panel: controls bound to config fields, Run/Stop, a live ipympl figure, errors in view.

The run executes in a background thread, so the kernel stays responsive and Stop works: the panel's on_update
callback raises StopRequested once Stop is clicked, and every run() returns a partial result when that happens.
"""

from __future__ import annotations

import html
import io
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any

import ipywidgets as widgets
from distributed import Client
from matplotlib.figure import Figure

from .config import Config
from .live_canvas import live_figure
from .plots import plot_live
from .runtime.clusters.workers import get_workers
from .static_copy import SNAPSHOT_CLASS, queue_static
from .trace import Result, StopRequested, to_frame

RunFn = Callable[[Any, Client, Any], Result]
PlotFn = Callable[[Figure, Any], None]
#: How long a panel's static run may take when a chapter is executed for the book (static_copy.SNAPSHOT_ENV).
SNAPSHOT_TIMEOUT_S = 900.0


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
        queue_static(self.static_view)

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

    def static_view(self) -> list[Any]:
        """Its static figure for the book: run the current settings if nobody has, wait, then the figure and caption."""
        from IPython.display import HTML, Image

        if self.result is None and not self.running:
            self.start(live=False)
        self.wait(SNAPSHOT_TIMEOUT_S)
        return [Image(data=self.snapshot_png(), format="png"), HTML(self.snapshot_caption())]

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


def _summary_html(result: Result) -> str:
    """The run's summary as items that wrap onto more lines, so a narrow panel never cuts figures off."""
    items = "".join(
        f"<div style='min-width:8em'><b>{html.escape(k)}</b><br>"
        f"{f'{v:.4g}' if isinstance(v, float) else html.escape(str(v))}</div>"
        for k, v in result.summary.items()
    )
    return f"<div class='dsgd-summary' style='display:flex;flex-wrap:wrap;gap:4px 16px;max-width:100%'>{items}</div>"


