"""A setting's kind, choices and bounds hold for a config however it is built (flag, JSON,
Python), with the flag's phrase; every default satisfies its own setting."""

from __future__ import annotations

import dataclasses
import math

import pytest

from unbiased.benchmarks import all_specs
from unbiased.methods import METHODS, method_config
from unbiased.settings import TrialSettings, setting_problems


def test_every_default_satisfies_its_own_setting():
    for cls in [*(m.Config for m in METHODS.values()), TrialSettings,
                *(spec.settings for spec in all_specs() if spec.settings is not None)]:
        assert setting_problems(cls()) == [], cls.__name__
    for name in METHODS:
        method_config(name, {})  # validates


@pytest.mark.parametrize(("values", "phrase"), [
    ({"lr": 0.0}, "lr must be > 0, got 0.0"),
    ({"lr": math.inf}, "lr must be finite, got inf"),
    ({"epochs": -3}, "epochs must be >= 1, got -3"),
    ({"mi_guard": "yes"}, "mi_guard must be true or false, got 'yes'"),
    ({"K": 2.5}, "K must be an integer, got 2.5"),
    ({"inner_z": "stale"}, "inner_z must be one of fresh, batch, bank, first_k"),
    ({"batch_size": 1}, "batch_size must be >= 2, got 1"),
    ({"mine_ema_rate": 1.5}, "mine_ema_rate must be in [0, 1], got 1.5"),
    ({"bank_size": 1}, "bank_size must be >= 2, got 1"),
    ({"lr_schedule": "cosine"}, "lr_schedule 'cosine' needs the trial's epochs"),
])
def test_a_config_built_in_python_is_checked_as_its_flag_is(values, phrase):
    with pytest.raises(ValueError, match=phrase.replace("[", r"\[").replace("(", r"\(")):
        method_config("mi_backprop", values)


def test_the_flag_and_the_config_say_the_same():
    from sweeps.cli import POS_FLOAT  # noqa: F401 - the flags are made from the same bounds
    from unbiased.methods.base import TrainConfig

    lr = {f.name: f for f in dataclasses.fields(TrainConfig)}["lr"]
    flag_phrase = lr.metadata["setting"].problem(0.0)
    with pytest.raises(ValueError, match=f"lr {flag_phrase}"):
        method_config("mi_backprop", {"lr": 0.0})


def test_help_shows_each_default_and_the_presets_that_differ():
    from sweeps.cli import build_parser
    from unbiased.benchmarks.digits.spec import DIGITS

    text = " ".join(build_parser("digits_grid", "d", DIGITS).format_help().split())
    batch = {name: values["batch_size"] for name, values in DIGITS.items()
             if values.get("batch_size", 1024) != 1024}
    shown = ", ".join(f"{name} {value}" for name, value in batch.items())
    assert f"mini-batch size (default: 1024; presets: {shown})" in text
    assert "epochs per trial (default: none; presets: quick " in text
    assert "(set by --preset; presets: quick 0," in text  # --seeds: no default of its own
    assert "from --preset" not in text


def test_method_names_in_help_and_tables_come_from_the_registry():
    from analysis.published import METHOD_LABELS, PUBLISHED_METHOD
    from sweeps.cli import build_parser
    from unbiased.benchmarks.digits.spec import DIGITS
    from unbiased.method_catalogue import CATALOGUE

    assert list(METHODS) == list(CATALOGUE) == list(METHOD_LABELS)
    for name, cls in METHODS.items():
        assert cls.name == name
    text = " ".join(build_parser("digits_grid", "d", DIGITS).format_help().split())
    assert all(f"{name} ({entry.about})" in text for name, entry in CATALOGUE.items())
    assert set(PUBLISHED_METHOD.values()) <= set(METHODS)
