"""The chapter's widget panel: one config that runs either synchronous or asynchronous SGD, and its controls."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from distributed import Client

from ..config import check_bool, check_choice, check_int, sized
from ..runtime.clusters.workers import capacity, get_workers
from ..trace import OnUpdate, Result
from .async_sgd import AsyncConfig, run_async
from .delays import STRAGGLER_MODELS
from .sync import SyncConfig, run_sync

MODES = ("sync", "async")


@dataclass(frozen=True)
class PlaygroundConfig(SyncConfig):
    """SyncConfig plus the asynchronous options; `mode` picks which algorithm runs."""

    mode: str = "sync"
    staleness_aware: bool = False
    staleness_bound: int | None = None

    def validate(self) -> None:
        check_choice("mode", self.mode, MODES)
        super().validate()
        check_bool("staleness_aware", self.staleness_aware)
        if self.staleness_bound is not None:
            check_int("staleness_bound", self.staleness_bound, 0, 1000)

    @property
    def world(self) -> int:
        return self.workers + (self.backups if self.mode == "sync" else 0)

    def resolved(self) -> SyncConfig | AsyncConfig:
        """The SyncConfig or AsyncConfig this playground setting stands for."""
        cls = SyncConfig if self.mode == "sync" else AsyncConfig
        names = {f.name for f in fields(cls)}
        values = {k: v for k, v in self.as_dict().items() if k in names}
        if self.mode == "async":
            values["delay_script"] = None if self.delay_script is None else self.delay_script[: self.workers]
        return cls(**values)


def run_playground(config: PlaygroundConfig, client: Client, on_update: OnUpdate | None = None) -> Result:
    """Grow the local cluster to the processes the run needs, then run sync or async SGD."""
    inner = config.resolved()
    get_workers(client, inner.world)  # grows a cluster the course may scale; else the run says what is short
    run = run_sync if isinstance(inner, SyncConfig) else run_async
    return run(inner, client, on_update)


def make_panel(client: Client, config: PlaygroundConfig | None = None, max_workers: int = 4) -> Any:
    """ExperimentPanel with workers, backups (max follows workers), straggler, severity, bound, aware, 1-bit.

    The workers slider reaches max_workers, or fewer when the cluster cannot grow that far.
    """
    max_workers = capacity(client, max_workers)
    config = config or PlaygroundConfig(steps=sized(150, 40), straggler="lognormal", severity=0.02,
                                        workers=min(2, max_workers))
    import ipywidgets as widgets

    from ..panel import ExperimentPanel
    from .plots import plot_live

    style = {"description_width": "initial"}
    w = {
        "mode": widgets.ToggleButtons(options=MODES, value=config.mode, description="mode", style=style),
        "workers": widgets.IntSlider(config.workers, 1, max_workers, description="workers N",
                                     continuous_update=False, style=style),
        "backups": widgets.IntSlider(min(config.backups, config.workers), 0, config.workers,
                                     description="backups b", continuous_update=False, style=style),
        "straggler": widgets.Dropdown(options=STRAGGLER_MODELS, value=config.straggler, description="straggler",
                                      style=style),
        "severity": widgets.FloatLogSlider(max(config.severity, 0.001), base=10, min=-3, max=-0.5,
                                           description="severity (s)", continuous_update=False, style=style),
        "staleness_bound": widgets.Dropdown(options=[("none", None)] + [(str(s), s) for s in range(9)],
                                            value=config.staleness_bound, description="staleness bound s",
                                            style=style),
        "staleness_aware": widgets.Checkbox(config.staleness_aware, description="staleness-aware lr"),
        "compression": widgets.Checkbox(config.compression, description="1-bit compression"),
    }

    def follow(change: dict[str, Any]) -> None:
        w["backups"].max = change["new"]  # the slider clamps its value to the new maximum

    w["workers"].observe(follow, names="value")
    return ExperimentPanel(
        client, run_playground, config, w, plot=plot_live, resize_cluster=False,
        title="Synchronous vs asynchronous SGD",
    )
