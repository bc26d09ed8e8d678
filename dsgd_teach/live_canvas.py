"""A matplotlib figure drawn live by an ipympl canvas widget, safe to redraw from a run thread.

Importing ipympl switches pyplot's backend to ipympl when matplotlib is already loaded (its package __init__ calls
matplotlib.use). A chapter that chose `%matplotlib inline` would then get widget canvases from every later
`plt.subplots`; displaying one prints it while JupyterLab's widget subshell handles a message for it on another
thread, and that message found no figure manager ("'NoneType' object has no attribute 'handle_json'"). So the
backend is put back as it was.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

import matplotlib
from matplotlib import rcsetup
from matplotlib.figure import Figure


def _import_ipympl() -> tuple[type, type]:
    """ipympl's Canvas and FigureManager, with pyplot's backend left as it was before the import."""
    before = matplotlib.rcParams._get_backend_or_none()  # None: not chosen yet (matplotlib picks one when needed)
    from ipympl.backend_nbagg import Canvas, FigureManager

    if matplotlib.rcParams._get_backend_or_none() != before:
        matplotlib.use(rcsetup._auto_backend_sentinel if before is None else before)
    return Canvas, FigureManager


Canvas, FigureManager = _import_ipympl()
_figure_numbers = itertools.count(1000)


class _LockedCanvas(Canvas):  # type: ignore[misc, valid-type]
    """An ipympl canvas whose browser-driven redraws and whose prints take the panel's lock (matplotlib is not
    thread-safe).

    matplotlib's print_figure (savefig, a panel's snapshot, the widget's own PNG) takes the canvas's figure manager
    away while it prints. JupyterLab sends widget messages on a subshell, handled on a thread of their own while
    a cell runs: such a message waits for the print on the lock, and one that arrives from within a print on the
    same thread is held until the print ends.
    """

    def __init__(self, figure: Figure, lock: threading.RLock) -> None:
        super().__init__(figure)
        self._draw_lock = lock
        self._deferred: list[tuple[Any, Any, Any]] = []

    def _handle_message(self, object, content, buffers):  # noqa: A002, ANN001, ANN202 - ipympl's signature
        with self._draw_lock:
            if self.manager is None:  # a print on this thread is under way: handled when it ends
                self._deferred.append((object, content, buffers))
                return None
            return super()._handle_message(object, content, buffers)

    def print_figure(self, *args: Any, **kwargs: Any) -> Any:
        """matplotlib's print_figure under the lock, then the browser messages that came while it printed."""
        with self._draw_lock:
            try:
                return super().print_figure(*args, **kwargs)
            finally:
                while self._deferred and self.manager is not None:
                    super()._handle_message(*self._deferred.pop(0))


def live_figure(figsize: tuple[float, float], lock: threading.RLock | None = None) -> tuple[Figure, Canvas]:
    """A matplotlib figure drawn by an ipympl canvas widget, whatever the notebook's global backend.

    The run thread redraws the figure while the kernel's main thread renders it for the browser; both hold
    `lock`, so they never touch the figure at the same time.
    """
    fig = Figure(figsize=figsize, dpi=90)
    canvas = _LockedCanvas(fig, lock or threading.RLock())
    FigureManager(canvas, next(_figure_numbers))
    canvas.header_visible = False
    canvas.footer_visible = False
    canvas.toolbar_visible = False
    canvas.resizable = False
    return fig, canvas
