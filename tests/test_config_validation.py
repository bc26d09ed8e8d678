"""Every field of every registered experiment config rejects a bad value with a ValueError naming the field."""

from __future__ import annotations

import dataclasses
import math
import typing

import pytest

from dsgd_teach.config import check_choice, check_float, check_int
from dsgd_teach.experiments import registry

EXPERIMENTS = registry()


def _bad_values(annotation: typing.Any, default: typing.Any) -> list[typing.Any]:
    """Values no sensible field of this type accepts."""
    text = str(annotation)
    if isinstance(default, bool) or text == "bool" or "bool" in text.split("|")[0]:
        return ["yes", 2]
    if isinstance(default, int) or text.startswith("int"):
        return [-(10**9), 10**12, "three", 1.5]
    if isinstance(default, float) or text.startswith("float"):
        return [math.nan, -1e12, 1e12, "fast"]
    if isinstance(default, str) or text.startswith("str"):
        return ["no-such-choice", 42]
    if isinstance(default, tuple):
        return ["not a tuple", (-(10**9),)]
    return [object()]


CASES = [
    (name, field.name, bad)
    for name, exp in sorted(EXPERIMENTS.items())
    for field in dataclasses.fields(exp.config_cls)
    for bad in _bad_values(typing.get_type_hints(exp.config_cls)[field.name], field.default)
]


def test_registry_has_the_foundation_experiments():
    assert {"sgd", "data-parallel"} <= set(EXPERIMENTS)


@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_defaults_are_valid(name):
    config = EXPERIMENTS[name].config_cls()
    assert config == config.replace()


def _label(value: typing.Any) -> str:
    """A test id part that is the same in every process (a bare object's repr holds its address)."""
    return "object()" if type(value) is object else repr(value)


@pytest.mark.parametrize(("name", "field", "bad"), CASES, ids=[f"{n}.{f}={_label(b)}"[:60] for n, f, b in CASES])
def test_bad_value_names_the_field(name, field, bad):
    config_cls = EXPERIMENTS[name].config_cls
    with pytest.raises(ValueError, match=field):
        config_cls(**{field: bad})


def test_configs_are_frozen():
    config = EXPERIMENTS["sgd"].config_cls()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.lr = 1.0  # type: ignore[misc]


def test_messages_state_the_allowed_range():
    with pytest.raises(ValueError, match=r"workers must be an integer in \[1, 64\], got 0"):
        check_int("workers", 0, 1, 64)
    with pytest.raises(ValueError, match=r"density must be a number in \(0, 1\], got 0"):
        check_float("density", 0, 0, 1, lo_open=True)
    with pytest.raises(ValueError, match="optimizer must be one of 'sgd', 'adagrad'; got 'adam'"):
        check_choice("optimizer", "adam", ("sgd", "adagrad"))
    with pytest.raises(ValueError, match="steps must be an integer"):
        check_int("steps", True, 1)
