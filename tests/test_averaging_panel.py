"""Chapter 08 panels: the controls reach the config, Run produces a result, the live figure is redrawn."""

from __future__ import annotations

import pytest

from dsgd_teach.averaging import FedAvgConfig, LocalSGDConfig
from dsgd_teach.averaging.panel import fedavg_panel, local_sgd_panel
from dsgd_teach.runtime.clusters.cluster import worker_addresses


def _image_bytes(panel) -> bytes:  # noqa: ANN001 - an ExperimentPanel
    panel.figure.canvas.draw()
    return bytes(panel.figure.canvas.buffer_rgba())


@pytest.mark.timeout(150)
def test_fedavg_panel_runs_with_its_controls(client):
    panel = fedavg_panel(client, FedAvgConfig(steps=4, fraction=0.25))
    blank = _image_bytes(panel)
    panel.controls["partition"].value = "iid"
    panel.controls["local_epochs"].value = 2
    panel.controls["dropout"].value = 0.5
    panel.run_button.click()
    result = panel.wait(120)
    assert panel.error is None, panel.error
    assert result.config.partition == "iid" and result.config.local_epochs == 2 and result.config.dropout == 0.5
    assert result.summary["rounds"] == 4
    assert _image_bytes(panel) != blank
    accuracy, clients = panel.figure.axes
    assert len(accuracy.lines) == 1 and len(accuracy.lines[0].get_xdata()) == 4, "no accuracy curve drawn"
    assert len(clients.patches) == 8, "no bars of kept and lost clients"


@pytest.mark.timeout(150)
def test_local_sgd_panel_runs_with_its_controls(client):
    panel = local_sgd_panel(client, LocalSGDConfig(steps=16, eval_every=4))
    panel.controls["sync_every"].value = 4
    panel.run_button.click()
    result = panel.wait(120)
    assert panel.error is None, panel.error
    assert result.config.sync_every == 4 and result.summary["rounds"] == 4
    assert all(len(ax.lines) == 1 for ax in panel.figure.axes), "no loss curves drawn"
    assert panel.controls["workers"].max == len(worker_addresses(client))
