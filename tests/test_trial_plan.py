"""The trial's plan takes the values of unbiased/settings.py's TrialSettings for settings its
config lacks: one source for every default, so the flags' help and a bare config agree."""

from __future__ import annotations

from dataclasses import fields

from unbiased.settings import TrialSettings
from unbiased.trial import Plan


def test_a_bare_config_gets_the_settings_defaults():
    defaults = TrialSettings()
    plan = Plan.of({"epochs": 3, "seed": 7})
    assert (plan.select, plan.mi_steps, plan.every) == (
        defaults.select_epoch, defaults.mi_eval_steps, defaults.mi_eval_every)
    assert (plan.epochs, plan.seed, plan.fail_at) == (3, 7, None)


def test_the_config_wins_over_the_defaults():
    plan = Plan.of({"epochs": 12, "seed": 0, "select_epoch": "lowest_mi_cond",
                    "mi_eval_steps": 11, "mi_eval_every": 5})
    assert (plan.select, plan.mi_steps, plan.every) == ("lowest_mi_cond", 11, 5)
    assert plan.stopping and plan.estimates_at(5) and not plan.estimates_at(4)
    assert plan.estimates_at(12)  # the last epoch always re-estimates
    assert plan.for_lam(0.0).select == "last"


def test_every_trial_setting_the_plan_reads_is_a_trial_setting():
    names = {f.name for f in fields(TrialSettings)}
    assert {"select_epoch", "mi_eval_steps", "mi_eval_every", "device"} <= names
