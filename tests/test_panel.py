"""The widget panel: set a control, click Run, a result appears; Stop stops; errors show in the panel."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import ipywidgets as widgets
import pytest

from dsgd_teach import static_copy as static_copy_module
from dsgd_teach.panel import ExperimentPanel
from dsgd_teach.sgd import DataParallelConfig, SGDConfig, run_data_parallel, run_sgd


def _image_bytes(panel: ExperimentPanel) -> bytes:
    panel.figure.canvas.draw()
    return bytes(panel.figure.canvas.buffer_rgba())


@pytest.mark.timeout(120)
def test_run_button_produces_a_result_with_the_control_values(client):
    panel = ExperimentPanel(
        client,
        run_sgd,
        SGDConfig(steps=40),
        {"batch_size": widgets.IntSlider(value=32, min=1, max=256), "lr": widgets.FloatSlider(value=0.5, max=2)},
    )
    blank = _image_bytes(panel)
    panel.controls["batch_size"].value = 8
    panel.run_button.click()
    result = panel.wait(90)
    assert panel.error is None
    assert result is not None and result.config.batch_size == 8
    assert result.summary["steps"] == 40
    assert panel.status.value.startswith("Done")
    assert "final_train_loss" in panel.summary.value
    assert _image_bytes(panel) != blank, "the live figure was not redrawn"
    assert not panel.run_button.disabled and panel.stop_button.disabled


@pytest.mark.timeout(120)
def test_stop_button_stops_a_long_run(client):
    panel = ExperimentPanel(client, run_data_parallel, DataParallelConfig(steps=100_000), resize_cluster=False)
    panel.run_button.click()
    deadline = time.monotonic() + 60
    while len(panel._events) < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    panel.stop_button.click()
    result = panel.wait(60)
    assert result is not None and result.stopped
    assert 0 < result.summary["steps"] < 100_000
    assert panel.status.value.startswith("Stopped")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("live", [True, False])
def test_a_snapshot_run_draws_its_figure_once_at_the_end(client, live: bool, monkeypatch: pytest.MonkeyPatch):
    """A Run click redraws the figure as results arrive; a snapshot's run, which nobody watches, draws it once."""
    frames: list[int] = []
    shown: list[object] = []

    def counting_plot(fig, trace):  # noqa: ANN001 - matplotlib Figure and a trace frame
        frames.append(len(trace))

    panel = ExperimentPanel(client, run_sgd, SGDConfig(steps=40), plot=counting_plot, redraw_every_s=0.0)
    if live:
        panel.run_button.click()
    else:  # what the post-cell hook does under DSGD_PANEL_SNAPSHOT=1, its display captured here
        monkeypatch.setattr("IPython.display.display", lambda *objects: shown.extend(objects))
        static_copy_module._pending.append(panel.static_view)
        static_copy_module.show_pending()
        assert len(shown) == 2  # the figure and its caption
    result = panel.wait(90)
    assert result is not None and panel.error is None and panel.status.value.startswith("Done")
    assert frames[-1] == len(result.trace)  # the end's figure shows the whole run either way
    assert (len(frames) > 1) == live, frames


@pytest.mark.timeout(60)
def test_invalid_settings_and_failures_are_shown_in_the_panel(client):
    panel = ExperimentPanel(client, run_sgd, SGDConfig(steps=5), {"lr": widgets.FloatText(value=-1.0)})
    panel.run_button.click()
    assert not panel.running
    assert "lr must be a number" in panel.error and "lr must be a number" in panel.error_box.value

    def broken_run(config, client, on_update=None):
        raise RuntimeError("worker exploded")

    panel = ExperimentPanel(client, broken_run, SGDConfig(steps=5))
    panel.run_button.click()
    assert panel.wait(30) is None
    assert "worker exploded" in panel.error_box.value and panel.status.value == "Failed."


def test_unknown_control_is_rejected(client):
    with pytest.raises(ValueError, match="not fields"):
        ExperimentPanel(client, run_sgd, SGDConfig(), {"nonsense": widgets.IntSlider()})


def test_the_summary_wraps_instead_of_running_off_the_panel():
    from dsgd_teach.panel import _summary_html
    from dsgd_teach.trace import Result

    summary = {f"figure_number_{i}": float(i) / 3 for i in range(12)} | {"note": "<b>x</b>"}
    text = _summary_html(Result(None, None, summary, None, False))
    assert "flex-wrap:wrap" in text and "<table" not in text
    assert text.count("<div style='min-width:8em'>") == len(summary)
    assert "figure_number_11</b><br>3.667" in text and "&lt;b&gt;x&lt;/b&gt;" in text


def test_a_browser_message_during_a_print_waits_for_the_print_instead_of_failing() -> None:
    """matplotlib's print_figure removes the canvas's figure manager while it prints; a message from the browser
    handled meanwhile (here: by an artist drawn during the print, on the printing thread) is handled afterwards."""
    import io

    from matplotlib.artist import Artist

    from dsgd_teach.live_canvas import live_figure

    fig, canvas = live_figure((3, 2))
    handled: list[str] = []
    canvas.manager.handle_json = lambda content: handled.append(content["type"])

    class MessageDuringDraw(Artist):
        def draw(self, renderer) -> None:  # noqa: ANN001 - matplotlib's signature
            canvas._handle_message(canvas, {"type": "refresh"}, [])

    fig.add_artist(MessageDuringDraw())
    fig.savefig(io.BytesIO(), format="png")
    assert handled == ["refresh"] and canvas.manager is not None


@pytest.mark.parametrize("backend", ["agg", "svg", "auto"])
def test_importing_the_panel_keeps_the_notebook_s_matplotlib_backend(backend: str) -> None:
    """ipympl's import switches pyplot to ipympl when matplotlib is loaded; a chapter that chose `%matplotlib inline`
    then got widget canvases from plt.subplots, printed on one thread while JupyterLab's widget subshell handled
    their messages on another ("'NoneType' object has no attribute 'handle_json'")."""
    code = (
        "import matplotlib, matplotlib.pyplot as plt\n"
        "before = matplotlib.rcParams._get_backend_or_none()\n"
        "import dsgd_teach.panel, dsgd_teach.transformer.panel\n"
        "print(before, matplotlib.rcParams._get_backend_or_none())\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}
    if backend != "auto":
        env["MPLBACKEND"] = backend
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    before, after = out.stdout.split()
    if before == "None":  # not chosen yet: pyplot, loaded, resolves it as it would have on its first figure
        assert "ipympl" not in after, f"importing the panel switched matplotlib's backend to {after}"
    else:
        assert after == before, f"importing the panel changed matplotlib's backend from {before} to {after}"


def test_the_ranking_widget_draws_without_pyplot(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its dropdowns redraw on the widget thread: a figure of its own, shown as a PNG, never pyplot's figures."""
    import matplotlib.pyplot as plt
    from IPython.display import Image

    from dsgd_teach.collectives.cost_model import AlphaBeta
    from dsgd_teach.transformer import panel
    from dsgd_teach.transformer.calibration import Calibration

    shown: list[object] = []
    monkeypatch.setattr(panel, "display", lambda *objs: shown.extend(objs))
    before = plt.get_fignums()
    box = panel.ranking_widget(Calibration(flops_per_s=1e10, overhead_s=1e-4, cores=2, link=AlphaBeta(1e-4, 1e-9)))
    box.children[0].children[1].value = 4  # N: redraws
    assert len(shown) == 2 and all(isinstance(o, Image) and o.data[:4] == b"\x89PNG" for o in shown)
    assert plt.get_fignums() == before
