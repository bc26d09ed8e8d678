"""The side-by-side panels and the simulator's plots, without a cluster (the simulated panel never needs one)."""

from __future__ import annotations

import matplotlib
import pytest

from dsgd_teach.sim import SimConfig, plot_result, run_simulated
from dsgd_teach.sim.panels import real_and_simulated
from dsgd_teach.syncasync import SyncConfig, run_sync

matplotlib.use("Agg")
pytestmark = pytest.mark.timeout(120)


def test_simulated_panel_runs_the_same_config_at_scale_without_touching_the_cluster() -> None:
    real_config = SyncConfig(workers=2, steps=8, straggler="exponential", severity=0.02)
    box = real_and_simulated(None, real_config, run_sync, {"compute_s": 0.003})
    real_panel, sim_panel = box.panels
    assert sim_panel.current_config().straggler == "exponential" and sim_panel.current_config().steps == 8
    sim_panel.controls["workers"].value = 5000  # clipped to the simulator's maximum
    assert sim_panel.controls["workers"].value == 1000 and sim_panel.controls["backups"].max == 100
    sim_panel.controls["workers"].value = 150
    sim_panel.controls["backups"].value = 6
    sim_panel.start()
    result = sim_panel.wait(90)
    assert sim_panel.error is None and result is not None
    assert result.config.workers == 150 and result.config.backups == 6
    assert (result.trace.event == "gradient").groupby(result.trace.step).sum().max() == 150
    real_panel.controls["workers"].value = 3
    assert real_panel.controls["backups"].max == 3


@pytest.mark.parametrize(
    "config",
    [SimConfig(workers=20, steps=5), SimConfig(algorithm="async", workers=8, steps=40),
     SimConfig(algorithm="allreduce", comm="doubling", workers=8, steps=3, elements=1000),
     SimConfig(mode="real", workers=2, steps=10, eval_every=5)],
)
def test_plot_result_draws_every_kind_of_simulated_trace(config: SimConfig) -> None:
    fig = plot_result(run_simulated(config))
    assert fig.axes and any(ax.has_data() for ax in fig.axes)
