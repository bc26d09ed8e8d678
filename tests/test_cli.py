"""The dsgd-teach command: run with a progress bar and a PNG, clear errors, doctor."""

from __future__ import annotations

import pytest

from dsgd_teach.cli import main


@pytest.mark.timeout(180)
def test_run_writes_a_figure_and_a_summary(tmp_path, capsys):
    out = tmp_path / "sgd.png"
    assert main(["run", "sgd", "--steps", "20", "--lr", "0.3", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "final_train_loss" in text and out.stat().st_size > 5000


def test_bad_values_give_a_clear_error(capsys):
    assert main(["run", "sgd", "--lr", "-1"]) == 2
    assert "lr must be a number" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["run", "no-such-experiment"])
    assert main(["frobnicate"]) == 2


@pytest.mark.parametrize(
    ("option", "expected"),
    [
        (["--batch-size", "abc"], "argument --batch-size: batch_size must be an integer in [1, 1000000], got 'abc'"),
        (["--lr", "fast"], "argument --lr: lr must be a number in (0.0, 100.0], got 'fast'"),
    ],
)
def test_a_value_of_the_wrong_type_names_field_type_and_range(option, expected, capsys):
    with pytest.raises(SystemExit):
        main(["run", "sgd", *option])
    err = capsys.readouterr().err
    assert expected in err and "<lambda>" not in err


def test_lists_experiments(capsys):
    assert main(["run"]) == 0
    assert "data-parallel" in capsys.readouterr().out


@pytest.mark.timeout(180)
def test_doctor_reports_versions_and_startup(capsys):
    assert main(["doctor"]) == 0
    text = capsys.readouterr().out
    for needle in ("torch", "cores available", "GPUs", "started in"):
        assert needle in text
