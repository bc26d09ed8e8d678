"""Chapter 07 without a cluster: schedules, splits, the bubble formula, config validation, bounded waits."""

from __future__ import annotations

import datetime
import time

import pytest
import torch

from dsgd_teach.pipeline import (
    SCHEDULES,
    PipelineConfig,
    ideal_bubble,
    microbatch_slices,
    peak_held,
    stage_bounds,
)
from dsgd_teach.pipeline.link import StageLink


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_every_schedule_runs_each_microbatch_forward_then_backward_once(name: str) -> None:
    for p in range(1, 9):
        for m in range(1, 17):
            for s in range(p):
                actions = SCHEDULES[name](p, m, s)
                assert sorted(actions) == sorted([("F", k) for k in range(m)] + [("B", k) for k in range(m)])
                for k in range(m):
                    assert actions.index(("F", k)) < actions.index(("B", k))
                want = {"naive": 1, "gpipe": m, "1f1b": min(p - s, m)}[name]
                assert peak_held(actions) == want


def test_1f1b_order_on_a_four_stage_pipeline() -> None:
    assert SCHEDULES["1f1b"](4, 6, 1) == [("F", 0), ("F", 1), ("F", 2), ("B", 0), ("F", 3), ("B", 1), ("F", 4),
                                          ("B", 2), ("F", 5), ("B", 3), ("B", 4), ("B", 5)]
    assert SCHEDULES["1f1b"](4, 6, 3)[:4] == [("F", 0), ("B", 0), ("F", 1), ("B", 1)]


def test_splits_and_bubble_formula() -> None:
    assert stage_bounds(8, 3) == [(0, 3), (3, 6), (6, 8)]
    assert [s.stop - s.start for s in microbatch_slices(20, 8)] == [3, 3, 3, 3, 2, 2, 2, 2]
    assert ideal_bubble(2, 8) == pytest.approx(1 / 9)
    assert ideal_bubble(4, 1) == pytest.approx(3 / 4) == ideal_bubble(4, 8, "naive")


@pytest.mark.parametrize(("field", "value", "match"), [
    ("stages", 9, r"stages must be an integer in \[1, 8\]"),
    ("microbatches", 65, r"microbatches must be an integer in \[1, 64\]"),
    ("schedule", "zigzag", "schedule must be one of"),
    ("gradient_delay", -1, "gradient_delay"),
    ("model", "resnet", "model must be one of"),
])
def test_bad_config_names_the_field(field: str, value: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        PipelineConfig(**{field: value})
    assert PipelineConfig(model="cnn", stages=4).n_units == 4
    with pytest.raises(ValueError, match="stages"):
        PipelineConfig(model="cnn", stages=5)


class _Work:
    """Stands in for a gloo request: returns or raises `outcome`, after `takes_s` (gloo's own timeout, say)."""

    def __init__(self, outcome: object, takes_s: float = 0.0) -> None:
        self.outcome, self.takes_s = outcome, takes_s

    def wait(self, timeout: datetime.timedelta) -> bool:
        time.sleep(self.takes_s)
        if isinstance(self.outcome, Exception):
            raise self.outcome
        return bool(self.outcome)


def test_a_wait_that_times_out_fails_loudly() -> None:
    link = StageLink(1, torch.device("cpu"), 0.5)
    with pytest.raises(TimeoutError, match="stage 1: receive of x from stage 0 did not complete within 0.5 s"):
        link._wait(_Work(False), "receive of x from stage 0")
    with pytest.raises(TimeoutError, match=r"stage 1: receive of x from stage 0 failed after 0\.\d\d s \(is a "
                                           r"neighbouring stage dead\?\): Connection closed"):
        link._wait(_Work(RuntimeError("Connection closed by peer")), "receive of x from stage 0")
    with pytest.raises(TimeoutError, match=r"stage 1: receive of x from stage 0 did not complete within 0.5 s \(is a "
                                           r"neighbouring stage dead\?\): Operation timed out!"):
        link._wait(_Work(RuntimeError("Operation timed out!"), takes_s=0.5), "receive of x from stage 0")
    link._wait(_Work(True), "fine")


def test_receives_are_posted_ahead_in_the_schedules_order(monkeypatch: pytest.MonkeyPatch) -> None:
    posted: list[tuple[tuple[int, ...], int]] = []

    def fake_irecv(buf: torch.Tensor, src: int, group: object = None) -> _Work:
        posted.append((tuple(buf.shape), src))
        return _Work(True)

    monkeypatch.setattr("dsgd_teach.pipeline.link.dist.irecv", fake_irecv)
    link = StageLink(1, torch.device("cpu"), 0.5, ahead=2)
    plan = [((3, 4), 0, "activation of microbatch 0", False), ((3, 4), 0, "activation of microbatch 1", False),
            ((3, 2), 2, "gradient of microbatch 1", True), ((3, 2), 2, "gradient of microbatch 0", True)]
    link.plan(plan)
    assert posted == [((3, 4), 0), ((3, 4), 0)]  # two posted before the stage asks for anything
    buf, _ = link.recv((3, 4), 0, "activation of microbatch 0")
    assert buf.shape == (3, 4) and posted[-1] == ((3, 2), 2)  # the window moved on by one
    link.recv((3, 4), 0, "activation of microbatch 1")
    with pytest.raises(RuntimeError, match="expected gradient of microbatch 1 from stage 2"):
        link.recv((3, 2), 2, "gradient of microbatch 0", gradient=True)


def test_gradients_travel_on_their_own_group_and_activations_on_the_default_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    groups: list[tuple[str, object]] = []

    def fake(kind: str):  # noqa: ANN202 - stands in for dist.isend / dist.irecv
        def op(tensor: torch.Tensor, peer: int, group: object = None) -> _Work:
            groups.append((kind, group))
            return _Work(True)
        return op

    monkeypatch.setattr("dsgd_teach.pipeline.link.dist.isend", fake("send"))
    monkeypatch.setattr("dsgd_teach.pipeline.link.dist.irecv", fake("recv"))
    gradients = object()
    link = StageLink(1, torch.device("cpu"), 0.5, ahead=1, gradient_group=gradients)
    link.plan([((3, 4), 0, "activation of microbatch 0", False), ((3, 2), 2, "gradient of microbatch 0", True)])
    link.recv((3, 4), 0, "activation of microbatch 0")
    link.send(torch.ones(3, 2), 2, "activation of microbatch 0")
    link.recv((3, 2), 2, "gradient of microbatch 0", gradient=True)
    link.send(torch.ones(3, 4), 0, "gradient of microbatch 0", gradient=True)
    link.finish()
    assert groups == [("recv", None), ("recv", gradients), ("send", None), ("send", gradients)]


def test_bubble_of_all_stages_and_of_the_busiest() -> None:
    import pandas as pd

    from dsgd_teach.pipeline import measured_bubble

    rows = [(0, "forward", 0.0, 4.0), (0, "backward", 6.0, 4.0), (1, "forward", 4.0, 2.0), (1, "backward", 4.0, 2.0)]
    trace = pd.DataFrame([{"step": 1, "worker": w, "event": e, "t_start": t, "duration": d} for w, e, t, d in rows])
    row = measured_bubble(trace).iloc[0]
    assert row.span_s == 10.0 and row.busy_s == 12.0
    assert row.bubble == pytest.approx(1 - 12 / 20) and row.bubble_busiest == pytest.approx(1 - 8 / 10)
    # stage 0 idles 2 s between its actions, stage 1 4 s before and 4 s after: a traced 1.5 s wait of stage 0 is
    # waiting, the other 0.5 s overhead; stage 1's wait before its first action is counted once, in its lead
    rows = [(0, "forward", 0.0, 4.0), (0, "backward", 6.0, 4.0), (1, "forward", 4.0, 1.0), (1, "backward", 5.0, 1.0),
            (0, "idle", 4.2, 1.5), (1, "idle", 0.0, 4.0)]
    trace = pd.DataFrame([{"step": 1, "worker": w, "event": e, "t_start": t, "duration": d} for w, e, t, d in rows])
    row = measured_bubble(trace).iloc[0]
    assert row.bubble == pytest.approx(1 - 10 / 20)
    assert row.waiting == pytest.approx((1.5 + 8.0) / 20) and row.overhead == pytest.approx(0.5 / 20)
