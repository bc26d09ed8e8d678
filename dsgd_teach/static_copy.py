"""Static copies of widgets, for readers where a live widget cannot render (the course as a book).

When `make course` executes a chapter for the book it sets SNAPSHOT_ENV. Then each widget a cell builds through
`leave_static` (or `queue_static`), and any widget that is a cell's value, leaves a static copy beneath the cell
once it ends: figures as PNGs and a caption with the widget's settings, marked with SNAPSHOT_CLASS so that the
book can style it and its checks can count it. Nothing happens outside such a kernel.
"""

from __future__ import annotations

import base64
import html
import os
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import ipywidgets as widgets

#: Set for the kernels that `make course` runs: every panel a cell builds runs its settings once when the cell ends
#: and leaves a static figure of that run beneath it; every other widget leaves a static copy of its state.
SNAPSHOT_ENV = "DSGD_PANEL_SNAPSHOT"
#: The CSS class of every static copy's caption: the book styles it, its tests count it.
SNAPSHOT_CLASS = "dsgd-panel-snapshot"
W = TypeVar("W", bound=widgets.Widget)
#: What the post-cell hook shows: functions of no arguments returning the objects to display.
_pending: list[Callable[[], list[Any]]] = []


def queue_static(render: Callable[[], list[Any]]) -> None:
    """Under SNAPSHOT_ENV in IPython: display render()'s objects once the cell that queued it ends."""
    if _install_hook():
        _pending.append(render)


def leave_static(widget: W, title: str, render: Callable[[], list[Any]] | None = None) -> W:
    """Return widget; under SNAPSHOT_ENV, once the cell that built it ends, show a static copy of it beneath it.

    render returns the objects to display (figures first, then an HTML caption with SNAPSHOT_CLASS); by default,
    static_copy of the widget's state as the cell left it.
    """
    queue_static(render or (lambda: static_copy(widget, title)))
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


def _install_hook() -> bool:
    """Under SNAPSHOT_ENV in IPython: register the post-cell hook once; whether it is registered."""
    if os.environ.get(SNAPSHOT_ENV) != "1":
        return False
    from IPython import get_ipython

    shell = get_ipython()
    if shell is None:
        return False
    if show_pending not in shell.events.callbacks["post_run_cell"]:
        shell.events.register("post_run_cell", show_pending)
    return True


def show_pending(result: Any = None) -> None:
    """IPython's post_run_cell hook: show each queued static copy. A cell whose value is a widget, and that queued
    nothing, leaves static_copy of it (a widget that draws its own figure, as ipympl's does, needs none)."""
    from IPython.display import display

    shown = bool(_pending)
    while _pending:
        display(*_pending.pop(0)())
    value = getattr(result, "result", None)
    if not shown and isinstance(value, widgets.Widget) and not hasattr(value, "figure"):  # a panel, ipympl
        display(*static_copy(value))


_install_hook()  # a kernel under SNAPSHOT_ENV: widgets shown as a cell's value leave static copies
