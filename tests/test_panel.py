"""The widget panel: set a control, click Run, a result appears; Stop stops; errors show in the panel."""

from __future__ import annotations

import time

import ipywidgets as widgets
import pytest

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

    from dsgd_teach.panel import live_figure

    fig, canvas = live_figure((3, 2))
    handled: list[str] = []
    canvas.manager.handle_json = lambda content: handled.append(content["type"])

    class MessageDuringDraw(Artist):
        def draw(self, renderer) -> None:  # noqa: ANN001 - matplotlib's signature
            canvas._handle_message(canvas, {"type": "refresh"}, [])

    fig.add_artist(MessageDuringDraw())
    fig.savefig(io.BytesIO(), format="png")
    assert handled == ["refresh"] and canvas.manager is not None
