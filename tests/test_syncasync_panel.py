"""Chapter 04 panel and playground: the controls, the backups maximum that follows N, and one run through it."""

from __future__ import annotations

import pytest

from dsgd_teach.syncasync import AsyncConfig, PlaygroundConfig, SyncConfig, make_panel

pytestmark = pytest.mark.timeout(240)


def test_playground_resolves_to_the_right_config() -> None:
    sync = PlaygroundConfig(workers=3, backups=1, compression=True).resolved()
    assert isinstance(sync, SyncConfig) and sync.world == 4 and sync.compression
    asy = PlaygroundConfig(mode="async", workers=3, backups=2, staleness_bound=2, staleness_aware=True).resolved()
    assert isinstance(asy, AsyncConfig) and asy.world == 3 and asy.staleness_bound == 2 and asy.staleness_aware
    with pytest.raises(ValueError, match="mode"):
        PlaygroundConfig(mode="hybrid")
    with pytest.raises(ValueError, match="staleness_bound"):
        PlaygroundConfig(staleness_bound=-2)


def test_panel_controls_and_one_async_run(client) -> None:
    panel = make_panel(client, PlaygroundConfig(steps=20, eval_every=5), max_workers=4)
    controls = panel.controls
    assert set(controls) == {
        "mode", "workers", "backups", "straggler", "severity", "staleness_bound", "staleness_aware", "compression"
    }
    controls["workers"].value = 3
    assert controls["backups"].max == 3
    controls["backups"].value = 3
    controls["workers"].value = 1
    assert controls["backups"].max == 1 and controls["backups"].value == 1
    controls["workers"].value = 2
    controls["mode"].value = "async"
    controls["staleness_bound"].value = 1
    controls["straggler"].value = "none"
    panel.start()
    result = panel.wait(timeout=200)
    assert panel.error is None, panel.error
    pushes = result.trace[result.trace.event == "push"]
    assert len(pushes) == 20 and pushes.staleness.max() <= 1
