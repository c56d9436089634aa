"""Selection rules on small synthetic final rows whose right answers are known."""

from __future__ import annotations

import dataclasses
import math

import pandas as pd
import pytest

from analysis.results import excluded_mask, final_rows, per_lambda
from analysis.selection import (
    Choice,
    HighestFittingLambda,
    LowestMI,
    NoCandidateError,
    OracleTest,
    default_rules,
)
from tests.synthetic import frame, trial

NAN = math.nan


def finals(*specs: dict) -> pd.DataFrame:
    """Final rows of trials given as dicts of trial() arguments (seed defaults to 0)."""
    rows = []
    for spec in specs:
        rows += trial(**spec)
    return final_rows(frame(rows))


def sweep() -> pd.DataFrame:
    """lam 2 has the lowest MI and best test acc but no longer fits the training data."""
    return finals(
        dict(lam=0.0, mi=1.0, train_acc=0.99, test_acc=0.50),
        dict(lam=0.5, mi=0.5, train_acc=0.98, test_acc=0.70),
        dict(lam=1.0, mi=0.2, train_acc=0.96, test_acc=0.80),
        dict(lam=2.0, mi=0.05, train_acc=0.80, test_acc=0.85),
    )


def test_lowest_mi_rejects_lambda_that_stops_fitting() -> None:
    choice = LowestMI().choose(sweep())
    assert choice == Choice(1.0, "lowest-MI (label-free)", choice.reason)
    assert "rejected" in choice.reason and "λ=2" in choice.reason


def test_tolerance_is_a_constructor_argument() -> None:
    assert LowestMI(tolerance=0.2).choose(sweep()).lam == 2.0
    assert HighestFittingLambda(tolerance=0.2).choose(sweep()).lam == 2.0
    assert LowestMI(tolerance=0.01).choose(sweep()).lam == 0.5
    with pytest.raises(ValueError):
        LowestMI(tolerance=-1)


def test_highest_fitting_rejects_lambda_that_stops_fitting() -> None:
    choice = HighestFittingLambda().choose(sweep())
    assert choice.lam == 1.0
    assert "λ=0" in choice.reason


def test_oracle_peeks_and_says_so() -> None:
    choice = OracleTest().choose(sweep())
    assert choice.lam == 2.0
    assert "peeks at test labels" in OracleTest.name
    assert choice.rule == OracleTest.name


def test_highest_fitting_prefers_higher_lambda_over_lower_mi() -> None:
    f = finals(
        dict(lam=0.0, mi=1.0, train_acc=0.99),
        dict(lam=0.5, mi=0.1, train_acc=0.99),
        dict(lam=1.0, mi=0.3, train_acc=0.98),
    )
    assert HighestFittingLambda().choose(f).lam == 1.0
    assert LowestMI().choose(f).lam == 0.5


def test_highest_fitting_falls_back_to_zero() -> None:
    f = finals(
        dict(lam=0.0, mi=0.2, train_acc=0.99),
        dict(lam=0.5, mi=0.4, train_acc=0.99),  # fits but MI above lambda=0's
        dict(lam=1.0, mi=0.1, train_acc=0.50),  # lowers MI but does not fit
    )
    choice = HighestFittingLambda().choose(f)
    assert choice.lam == 0.0
    assert "fell back to λ=0" in choice.reason


def test_tie_goes_to_higher_lambda() -> None:
    f = finals(
        dict(lam=0.0, mi=1.0, train_acc=0.99, test_acc=0.7),
        dict(lam=0.5, mi=0.2, train_acc=0.99, test_acc=0.8),
        dict(lam=1.0, mi=0.2 + 1e-12, train_acc=0.99, test_acc=0.8),
    )
    lowest = LowestMI().choose(f)
    assert lowest.lam == 1.0 and "tie" in lowest.reason
    assert OracleTest().choose(f).lam == 1.0


def test_diverged_trials_are_ignored() -> None:
    f = finals(
        dict(lam=0.0, mi=1.0, train_acc=0.95, test_acc=0.5),
        dict(lam=0.5, mi=0.5, train_acc=0.95, test_acc=0.6),
        # would win every rule if it counted: NaN MI, then a diverged status
        dict(lam=1.0, mi=NAN, train_acc=1.0, test_acc=0.99),
        dict(lam=2.0, mi=0.0, train_acc=1.0, test_acc=0.99, status="diverged: loss nan"),
        # inf train accuracy
        dict(lam=3.0, mi=0.0, train_acc=math.inf, test_acc=0.99),
    )
    assert list(f.loc[f["excluded"], "lam"]) == [1.0, 2.0, 3.0]
    for rule in default_rules():
        assert rule.choose(f).lam == 0.5, rule.name
    # lambdas with no kept trial are not candidates (but are listed with n == 0)
    table = per_lambda(f)
    assert list(table.loc[table["n"] == 0, "lam"]) == [1.0, 2.0, 3.0]


def test_rules_drop_diverged_rows_without_final_rows_columns() -> None:
    raw = frame(trial(lam=0.0, mi=1.0, epochs=1) + trial(lam=1.0, mi=0.0, epochs=1,
                                                          status="diverged: x"))
    assert "excluded" not in raw.columns
    assert list(excluded_mask(raw)) == [False, True]
    assert LowestMI().choose(raw).lam == 0.0


def test_diverged_seed_is_dropped_from_the_lambda_mean() -> None:
    f = finals(
        dict(lam=0.0, mi=1.0, seed=0),
        dict(lam=0.5, mi=0.30, seed=0),
        dict(lam=0.5, mi=0.30, seed=1),
        dict(lam=1.0, mi=0.40, seed=0),
        dict(lam=1.0, mi=NAN, seed=1),  # diverged: lam 1's mean is 0.40 from seed 0 alone
    )
    table = per_lambda(f).set_index("lam")
    assert table.loc[1.0, "n"] == 1 and table.loc[1.0, "n_excluded"] == 1
    assert table.loc[1.0, "mi"] == pytest.approx(0.40)
    assert LowestMI().choose(f).lam == 0.5


def test_seeds_are_averaged_per_lambda_first() -> None:
    f = finals(
        dict(lam=0.0, mi=1.0, seed=0), dict(lam=0.0, mi=1.0, seed=1),
        dict(lam=0.5, mi=0.25, seed=0), dict(lam=0.5, mi=0.25, seed=1),
        dict(lam=1.0, mi=0.1, seed=0), dict(lam=1.0, mi=0.5, seed=1),  # mean 0.3
    )
    assert LowestMI().choose(f).lam == 0.5


def test_mi_eval_preferred_when_every_candidate_has_it() -> None:
    specs = [
        dict(lam=0.0, mi=1.0, mi_eval=0.9),
        dict(lam=0.5, mi=0.1, mi_eval=0.6),
        dict(lam=1.0, mi=0.3, mi_eval=0.2),
    ]
    choice = LowestMI().choose(finals(*specs))
    assert choice.lam == 1.0 and "mi_eval" in choice.reason
    specs[1] = dict(lam=0.5, mi=0.1, mi_eval=NAN)  # one candidate lacks it -> training mi
    choice = LowestMI().choose(finals(*specs))
    assert choice.lam == 0.5 and "lowest mi " in choice.reason


def test_no_candidates_raises() -> None:
    f = finals(dict(lam=0.0, mi=NAN), dict(lam=1.0, status="diverged: boom"))
    for rule in default_rules():
        with pytest.raises(NoCandidateError):
            rule.choose(f)


def test_choice_is_frozen() -> None:
    choice = LowestMI().choose(sweep())
    with pytest.raises(dataclasses.FrozenInstanceError):
        choice.lam = 0.0  # type: ignore[misc]


def test_a_lambda_whose_fresh_estimate_failed_is_not_picked_by_the_label_free_rules() -> None:
    # The screen preset's lntl at lam 1: mi_eval -0.02 against a prediction floor of 1.60,
    # so its MI is unknown; read as measured it would win both label-free rules.
    specs = [
        dict(lam=0.0, mi=NAN, mi_eval=2.6, test_acc=0.69, train_acc=1.0),
        dict(lam=0.01, mi=NAN, mi_eval=1.2, mi_floor=1.58, test_acc=0.83, train_acc=0.99),
        dict(lam=0.1, mi=NAN, mi_eval=1.3, mi_floor=1.58, test_acc=0.84, train_acc=0.99),
        dict(lam=1.0, mi=NAN, mi_eval=-0.02, mi_floor=1.60, test_acc=0.63, train_acc=0.99),
    ]
    f = finals(*specs)
    assert f.set_index("lam")["estimator_failed"].to_dict() == {
        0.0: False, 0.01: False, 0.1: False, 1.0: True}
    assert per_lambda(f).set_index("lam")["n_failed"].to_dict() == {
        0.0: 0, 0.01: 0, 0.1: 0, 1.0: 1}
    lowest, highest, oracle = (rule.choose(f) for rule in default_rules())
    assert (lowest.lam, highest.lam, oracle.lam) == (0.01, 0.1, 0.1)
    assert "MI not measured" in lowest.reason and "{1}" in lowest.reason
    # within the margin (0.5 nats) of the floor it is a reading like any other
    specs[3] = dict(lam=1.0, mi=NAN, mi_eval=1.15, mi_floor=1.60, test_acc=0.63, train_acc=0.99)
    f = finals(*specs)
    assert not f["estimator_failed"].any()
    assert LowestMI().choose(f).lam == 1.0 and HighestFittingLambda().choose(f).lam == 1.0


def test_conditional_floor_counts_too_and_no_measured_lambda_raises() -> None:
    f = finals(dict(lam=1.0, mi=NAN, mi_eval=1.5, mi_floor=1.6, mi_eval_cond=-0.9,
                    mi_floor_cond=0.0),
               dict(lam=3.0, mi=NAN, mi_eval=0.1, mi_floor=1.6))
    assert f["estimator_failed"].all()
    for rule in default_rules()[:2]:
        with pytest.raises(NoCandidateError, match="measured MI"):
            rule.choose(f)
    assert OracleTest().choose(f).lam in (1.0, 3.0)  # the oracle reads no MI
