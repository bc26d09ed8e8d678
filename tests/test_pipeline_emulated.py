"""Chapter 07's emulated devices, checked from the trace's structure, never from how long anything took.

Each stage's forward lasts at least T_F and its backward at least 2 T_F (measured computation, then an injected
sleep labelled `injected_s`). What must hold whatever the machine's load: every action carries its labelled
injected time and lasts at least the emulated device's time (a sleep never ends early); every stage plays its
schedule's actions in order; no stage starts a microbatch before its neighbour finished it; the idle time before a
stage's first action and before its first backward is at least what the injected times of the actions it waits for
add up to; and replaying the trace's own order of actions with the emulated device times gives exactly
(p-1)/(m+p-1). How close the *measured* bubble comes to that formula is timing: `make bench`
(dsgd_teach/bench/pipeline_emulated.py).
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from distributed import Client  # noqa: E402

from dsgd_teach.pipeline import SCHEDULES, PipelineConfig, ideal_bubble, plot_timeline, run_pipeline  # noqa: E402
from dsgd_teach.runtime.clusters.cluster import start_client  # noqa: E402

T_F = 0.04
SLACK = 2e-3  # the trace's clock (time.time) against the sleep's (perf_counter)
P, M = 2, 4
CONFIG = PipelineConfig(stages=P, microbatches=M, depth=4, hidden=16, batch_size=16, steps=2, lr=0.1,
                        device="cpu", timeout_s=30, emulated_forward_s=T_F)


@pytest.fixture(scope="module")
def client():
    with start_client(2, quiet=True, use_gpu=False) as c:
        yield c


@pytest.fixture(scope="module")
def traces(client: Client) -> dict[str, pd.DataFrame]:
    return {name: run_pipeline(CONFIG.replace(schedule=name), client).trace for name in ("gpipe", "1f1b")}


def _work(trace: pd.DataFrame, step: int) -> pd.DataFrame:
    work = trace[(trace.step == step) & trace.event.isin(["forward", "backward"])]
    return work.assign(end=work.t_start + work.duration, kind=work.event.str[0].str.upper())


def _nominal(kind: str) -> float:
    return T_F if kind == "F" else CONFIG.backward_device_s


def replayed_bubble(work: pd.DataFrame) -> float:
    """Idle fraction when each stage plays the actions in the order the trace recorded, each lasting the emulated
    device's time, starting as soon as its input is there (messages free)."""
    orders = {s: list(zip(rows.kind, rows.microbatch.astype(int), strict=True))
              for s, rows in work.sort_values("t_start").groupby("worker")}
    p = len(orders)
    done: dict[tuple[str, int, int], float] = {}
    free, nxt = [0.0] * p, [0] * p
    while any(nxt[s] < len(orders[s]) for s in range(p)):
        moved = False
        for s in range(p):
            while nxt[s] < len(orders[s]):
                kind, k = orders[s][nxt[s]]
                dep = (("F", k, s - 1) if s > 0 else None) if kind == "F" else \
                    (("B", k, s + 1) if s < p - 1 else ("F", k, s))
                if dep is not None and dep not in done:
                    break
                start = max(free[s], done.get(dep, 0.0) if dep else 0.0)
                free[s] = done[(kind, k, s)] = start + _nominal(kind)
                nxt[s] += 1
                moved = True
        assert moved, f"the recorded orders wait for each other: {orders}"
    busy = sum(_nominal(kind) for order in orders.values() for kind, _ in order)
    return 1 - busy / (p * max(free))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_emulated_devices_shape_the_trace(traces: dict[str, pd.DataFrame], schedule: str) -> None:
    trace = traces[schedule]
    for step in sorted(trace.step.dropna().unique()):
        work = _work(trace, int(step))
        # every action is labelled: measured computation plus injected sleep, lasting at least the device's time
        assert (work.injected_s > 0).all(), "an action without injected time: the emulation is off"
        # one clock reading ends each action: its two parts add up to its duration exactly, however busy the machine
        assert ((work.compute_s + work.injected_s - work.duration).abs() < 1e-9).all()
        assert (work.duration >= work.kind.map(_nominal) - SLACK).all(), "an action shorter than its device time"
        for s, rows in work.sort_values("t_start").groupby("worker"):
            assert list(zip(rows.kind, rows.microbatch.astype(int), strict=True)) == SCHEDULES[schedule](P, M, s)
        # no stage works on a microbatch before its neighbour is done with it
        at = {(r.kind, int(r.microbatch), int(r.worker)): r for r in work.itertuples()}
        for (kind, k, s), r in at.items():
            before = ("F", k, s - 1) if kind == "F" else ("B", k, s + 1)
            if before in at:
                assert r.t_start >= at[before].end - SLACK, (kind, k, s)
        # idle intervals implied by the injected times: stage 1 waits for stage 0's first forward, and stage 0
        # for stage 1's forward and backward of the microbatch it back-propagates first
        first = work.groupby("worker").t_start.min()
        assert first[1] - first[0] >= T_F - SLACK
        first_b = work[(work.worker == 0) & (work.kind == "B")].sort_values("t_start").iloc[0]
        last_f = work[(work.worker == 0) & (work.kind == "F") & (work.microbatch == first_b.microbatch)].iloc[0]
        assert first_b.t_start - last_f.end >= T_F + CONFIG.backward_device_s - SLACK
        assert replayed_bubble(work) == pytest.approx(ideal_bubble(P, M), abs=1e-9)


@pytest.mark.timeout(60)
def test_timeline_draws_injected_time_as_injected(traces: dict[str, pd.DataFrame]) -> None:
    fig, ax = plt.subplots()
    plot_timeline(ax, traces["gpipe"])
    hatched = [c for c in ax.collections if c.get_hatch()]
    assert len(hatched) == 2 * P * M, "each action's injected part is drawn hatched"
    assert "injected (emulated device)" in [t.get_text() for t in ax.get_legend().get_texts()]
    plt.close(fig)


def test_mode_is_named() -> None:
    assert CONFIG.mode == "emulated devices (t_f = 40 ms, t_b = 80 ms injected)"
    assert CONFIG.replace(emulated_forward_s=0.0).mode == "real compute"
    with pytest.raises(ValueError, match="emulated_forward_s"):
        CONFIG.replace(emulated_forward_s=-1.0)
