"""Late policy and extensions: the (deadline) row's points exactly as stated (started days, the penalty of the
points earned, the cut-off, extra days per student), bad values refused naming the field, and the command line's
--due/--late-penalty/--extensions wiring. The two routes apply it on real runs in tests/test_gradescope.py."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from dsgd_teach.grading.cli import build_parser, policy_of
from dsgd_teach.grading.deadlines import ROW, LatePolicy, parse_time, read_extensions, submitted_at
from dsgd_teach.grading.verdict import Grade

DUE = datetime(2026, 12, 1, 23, 59, tzinfo=timezone.utc)
GRADES = [Grade("q1", 2.0, 2.0, "passed"), Grade("q2", 2.0, 2.0, "passed"), Grade("q3", 0.0, 2.0, "failed"),
          Grade("(integrity)", 0.0, 0.0, "FLAGGED: x")]


def total(grades: list[Grade]) -> float:
    return round(sum(g.points for g in grades), 6)


@pytest.mark.parametrize(("late_by", "days", "points"), [
    (timedelta(0), 0, 4.0),  # exactly at the due date: on time
    (timedelta(seconds=1), 1, 3.6),  # one started day
    (timedelta(days=1), 1, 3.6),
    (timedelta(days=1, seconds=1), 2, 3.2),
    (timedelta(days=9, hours=23), 10, 0.0),  # 10 days at 10 %: all of it, never below zero
    (timedelta(days=30), 30, 0.0),
])
def test_penalty_per_started_day(late_by, days, points):
    policy = LatePolicy(DUE, penalty_per_day=0.1)
    assert policy.days_late(DUE + late_by) == days
    graded = policy.apply(GRADES, DUE + late_by, "ann")
    assert total(graded) == pytest.approx(points)
    assert graded[-1].question == ROW and graded[-1].max_points == 0.0
    assert ("on time" in graded[-1].reason) == (days == 0)


def test_cutoff_and_extensions():
    policy = LatePolicy(DUE, penalty_per_day=0.25, cutoff_days=2, extensions={"bob": 3.0, "ann@uni.edu": 0.5})
    assert total(policy.apply(GRADES, DUE + timedelta(days=2), "ann")) == pytest.approx(2.0)  # 2 days: -50 %
    past = policy.apply(GRADES, DUE + timedelta(days=2, minutes=1), "ann")
    assert total(past) == 0.0 and "cut-off" in past[-1].reason
    # Bob's 3 extra days move his due date, and with it the cut-off.
    assert total(policy.apply(GRADES, DUE + timedelta(days=3), "bob")) == pytest.approx(4.0)
    bob = policy.apply(GRADES, DUE + timedelta(days=4), "bob")
    assert total(bob) == pytest.approx(3.0) and "extension of 3 day(s)" in bob[-1].reason
    # The first identity with an extension counts (Gradescope: email, id, name).
    assert total(policy.apply(GRADES, DUE + timedelta(hours=11), "ann@uni.edu", "7", "Ann")) == pytest.approx(4.0)
    # Applying twice replaces the row, it does not deduct twice.
    twice = policy.apply(policy.apply(GRADES, DUE + timedelta(days=1), "ann"), DUE + timedelta(days=1), "ann")
    assert total(twice) == pytest.approx(3.0) and sum(g.question == ROW for g in twice) == 1


def test_bad_values_are_refused():
    with pytest.raises(ValueError, match="penalty_per_day"):
        LatePolicy(DUE, penalty_per_day=1.5)
    with pytest.raises(ValueError, match="cutoff_days"):
        LatePolicy(DUE, cutoff_days=-1)
    with pytest.raises(ValueError, match="UTC offset"):
        parse_time("2026-12-01T23:59", "due")
    with pytest.raises(ValueError, match="ISO 8601"):
        parse_time("next friday", "due")
    assert parse_time("2026-12-01 23:59:00.000000 UTC") == DUE  # nbgrader's timestamp.txt
    assert parse_time("2026-12-01T23:59:00Z") == DUE
    assert read_extensions("student,days\nann,1.5\nbob,0\n") == {"ann": 1.5, "bob": 0.0}
    for text, message in (("name,days\nann,1\n", "columns"), ("student,days\nann,soon\n", "line 2"),
                          ("student,days\nann,1\nann,2\n", "twice"), ("student,days\nann,-1\n", "line 2")):
        with pytest.raises(ValueError, match=message):
            read_extensions(text)


def test_command_line(tmp_path):
    ext = tmp_path / "ext.csv"
    ext.write_text("student,days\nann,2\n")
    args = build_parser().parse_args(["subs", "--due", "2026-12-01T23:59+00:00", "--late-penalty", "0.2",
                                      "--late-cutoff-days", "5", "--extensions", str(ext)])
    policy = policy_of(args)
    assert (policy.due, policy.penalty_per_day, policy.cutoff_days, dict(policy.extensions)) == (DUE, 0.2, 5.0,
                                                                                                 {"ann": 2.0})
    assert policy_of(build_parser().parse_args(["subs"])) is None
    with pytest.raises(ValueError, match="need --due"):
        policy_of(build_parser().parse_args(["subs", "--late-penalty", "0.1"]))


def test_submission_time(tmp_path):
    nb = tmp_path / "ann" / "ps01_sgd" / "ps01_sgd.ipynb"
    nb.parent.mkdir(parents=True)
    nb.write_text("{}")
    stamp = datetime(2026, 11, 30, 8, 0, tzinfo=timezone.utc).timestamp()
    import os

    os.utime(nb, (stamp, stamp))
    assert submitted_at(nb) == datetime(2026, 11, 30, 8, 0, tzinfo=timezone.utc)  # no timestamp.txt: mtime
    (nb.parent / "timestamp.txt").write_text("2026-12-02 10:00:00.000000 UTC")
    assert submitted_at(nb) == datetime(2026, 12, 2, 10, 0, tzinfo=timezone.utc)


def test_gradescope_late_policy_without_due_takes_gradescopes_due_date(tmp_path, monkeypatch):
    """`dsgd-teach gradescope --late-penalty/--late-cutoff-days/--extensions` without --due: the zip holds the
    policy and no due date, and each run takes the due date from Gradescope's submission metadata."""
    import json
    import zipfile

    from dsgd_teach.grading import gradescope_cli
    from dsgd_teach.grading.gradescope import CONFIG, late_policy

    monkeypatch.setattr(gradescope_cli, "requirements", lambda nb: ["numpy==1"])  # not what this test is about
    source = Path(__file__).resolve().parents[1] / "course" / "assignments" / "source"
    (tmp_path / "ext.csv").write_text("student,days\nann@uni.edu,1\n")
    out = tmp_path / "ag.zip"
    assert gradescope_cli.main(["ps01_sgd", "--out", str(out), "--source", str(source), "--late-penalty", "0.1",
                                "--late-cutoff-days", "5", "--extensions", str(tmp_path / "ext.csv")]) == 0
    with zipfile.ZipFile(out) as zf:
        config = json.loads(zf.read(CONFIG))
    assert config["due"] is None and config["late_penalty"] == 0.1 and config["late_cutoff_days"] == 5
    assert config["extensions"] == {"ann@uni.edu": 1.0}
    meta = {"assignment": {"due_date": "2026-12-01T23:59:00.000000-00:00"}}
    policy = late_policy(config, meta)
    assert policy is not None and policy.due == DUE
    assert total(policy.apply(GRADES, DUE + timedelta(days=1, seconds=1), "bob@uni.edu")) == 3.2
    assert total(policy.apply(GRADES, DUE + timedelta(hours=20), "ann@uni.edu")) == 4.0  # within her extra day
    assert total(policy.apply(GRADES, DUE + timedelta(days=6), "bob@uni.edu")) == 0.0  # past the cut-off
    assert late_policy(config, {}) is None  # no due date anywhere: no penalty
    # The zip's own --due wins over Gradescope's.
    assert late_policy({**config, "due": "2026-12-03T00:00+00:00"}, meta).due == DUE + timedelta(days=1, minutes=1)
