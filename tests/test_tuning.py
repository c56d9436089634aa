"""An equal tuning budget: every arm the same number of draws from its method's distributions
(unbiased/search.py), drawn through Tune's search spaces the same way in every launch."""

from __future__ import annotations

import math

import pytest

from sweeps.core import benchmark_grid
from sweeps.tuning import draw, search_points
from unbiased.methods import ERM, METHODS
from unbiased.search import ARMS, Choice, LogUniform, arm_space, search_space
from unbiased.settings import SETTINGS_KEY, flat_config


def test_every_method_draws_g_and_fs_settings_and_its_own():
    for name, cls in METHODS.items():
        space = search_space(cls)
        assert {"lr", "weight_decay"} <= set(space), name
    assert set(search_space(METHODS["group_dro"])) == {"lr", "weight_decay", "dro_step"}
    assert set(search_space(METHODS["mi_backprop"])) == {"lr", "weight_decay", "lam",
                                                         "mine_lr"}


def test_an_arm_draws_what_it_does_not_hold_and_erms_arms_only_erms_space():
    assert set(arm_space(ARMS["erm"], METHODS["group_reweight"], ERM)) == {"lr",
                                                                           "weight_decay"}
    assert set(arm_space(ARMS["group_dro"], METHODS["group_dro"], ERM)) == {
        "lr", "weight_decay", "dro_step"}
    assert "lam" in arm_space(ARMS["ours_resampled"], METHODS["mi_backprop"], ERM)


@pytest.mark.parametrize("arm", list(ARMS))
def test_each_draw_is_fixed_by_the_seed_arm_and_index_and_lies_in_its_distribution(arm):
    five, two = draw(arm, 5, search_seed=0), draw(arm, 2, search_seed=0)
    assert five[:2] == two
    assert draw(arm, 5, search_seed=1) != five
    space = arm_space(ARMS[arm], METHODS[ARMS[arm].method], ERM)
    for point in five:
        assert {k: point[k] for k in ARMS[arm].held} == ARMS[arm].held
        for key, dist in space.items():
            if isinstance(dist, LogUniform):
                assert dist.low * 0.995 <= point[key] <= dist.high * 1.005
                assert point[key] == float(f"{point[key]:.3g}")
            else:
                assert isinstance(dist, Choice) and point[key] in dist.values
    # five draws of a log-uniform lr over a decade are not one value
    assert len({p["lr"] for p in five}) == 5


def test_a_tuning_preset_runs_every_arm_the_same_draws_on_every_seed():
    spec = benchmark_grid("digits")
    values = {**spec.bench.presets["tune"], "seeds": [0, 1]}
    points = search_points(values, ("sigma",))
    assert len(points) == len(ARMS) * 5 * 2
    by_seed = {s: [(p["arm"], p["draw"], p["lam"], p[SETTINGS_KEY]) for p in points
                   if p["seed"] == s] for s in (0, 1)}
    assert by_seed[0] == by_seed[1]
    for arm in ARMS:
        assert sum(1 for p in points if p["arm"] == arm and p["seed"] == 0) == 5
    assert all(("K" in p) == (p["method"] == "mi_backprop") for p in points)
    assert {p["lam"] for p in points if p["arm"] in ("erm", "resampling")} == {0.0}
    picked = search_points({**values, "draw_of": {"group_dro": [3]}}, ("sigma",))
    dro = [p for p in picked if p["arm"] == "group_dro"]
    assert [p["draw"] for p in dro] == [3, 3]
    assert dro[0][SETTINGS_KEY] == next(p[SETTINGS_KEY] for p in points
                                        if p["arm"] == "group_dro" and p["draw"] == 3)
    assert len(picked) == len(points) - 2 * 4


def test_a_drawn_setting_reaches_the_trials_config_over_the_presets_value():
    spec = benchmark_grid("digits")
    values = spec.bench.presets["tune"]
    point = next(p for p in search_points(values, ("sigma",)) if p["arm"] == "group_dro")
    config = flat_config({**spec.fixed_values(values), "point": point})
    assert config["lr"] == point[SETTINGS_KEY]["lr"] != values["lr"]
    assert config["sampler"] == "groups" and config["val_frac"] == 0.1
    assert not math.isnan(config["dro_step"])
    spec.validate(values)  # every draw is a valid config of its method


def test_a_dry_run_lists_every_draw_with_its_settings():
    from drivers import run_sweep

    ran = run_sweep("biased_mnist", "--preset", "tune", "--root", ".", "--dry-run",
                    "--arms", "erm,group_dro", "--draw-of", "group_dro=1,3")
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.splitlines()
    assert "7 trials" in lines[0]
    header = lines[1].split()
    assert {"arm", "draw", "dro_step", "lr", "weight_decay", "sampler"} <= set(header)
    assert [line.split()[header.index("draw")] for line in lines[2:9]] == [
        "0", "1", "2", "3", "4", "1", "3"]
    shared = lines[-1]
    assert shared.startswith("shared: ") and " lr=" not in shared  # drawn, not shared


@pytest.mark.parametrize("argv, line", [
    (["--draw-of", "group_dro=2"], "argument --draw-of: group_dro=2: draws are numbered 0..1 "
                                   "(--draws 2)"),
    (["--arms", "erm", "--draw-of", "lntl=0"], "argument --draw-of: lntl is not in this "
                                               "sweep's --arms (erm)"),
    (["--arms", "erm,nope"], "argument --arms: nope: unknown arm; choose from erm, "),
])
def test_a_bad_draw_or_arm_is_one_line_before_anything_starts(argv, line):
    from drivers import run_sweep

    ran = run_sweep("digits", "--preset", "tune_quick", "--dry-run", *argv)
    assert ran.returncode == 2
    assert line in ran.stderr.strip().splitlines()[-1], ran.stderr


def test_draws_outside_a_tuning_sweep_are_refused():
    from drivers import run_sweep

    ran = run_sweep("digits", "--preset", "quick", "--draws", "3", "--dry-run")
    assert ran.returncode == 2
    assert ran.stderr.strip().splitlines()[-1].endswith(
        "argument --draws: only a tuning sweep (--arms, the `tune` presets) draws its points")
