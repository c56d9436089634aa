"""The label-free stopping rule over epochs (unbiased/stopping.py)."""

from __future__ import annotations

import pytest

from unbiased.stopping import EstimatedEpoch, could_be_picked, pick_epoch


def _records(rows: list[tuple[float, float]]) -> list[EstimatedEpoch]:
    return [EstimatedEpoch(i + 1, acc, mi) for i, (acc, mi) in enumerate(rows)]


def test_picks_the_lowest_mi_among_epochs_that_fit():
    # epoch 1 has the lowest MI but has not fitted (0.5 < 0.97 - 0.05): epoch 3 wins.
    recs = _records([(0.50, 0.1), (0.95, 2.0), (0.96, 1.2), (0.97, 1.8)])
    assert pick_epoch(recs) == 3
    assert pick_epoch(recs, tolerance=0.5) == 1


def test_ties_go_to_the_later_epoch_and_empty_is_an_error():
    assert pick_epoch(_records([(0.9, 1.0), (0.9, 1.0)])) == 2
    with pytest.raises(ValueError):
        pick_epoch([])


def test_only_dominated_epochs_are_dropped_and_the_pick_is_always_kept():
    recs = _records([(0.90, 1.0), (0.95, 0.9), (0.92, 0.5), (0.97, 2.0)])
    keep = could_be_picked(recs)
    assert 1 not in keep  # epoch 2 has higher accuracy and lower MI
    assert {2, 3, 4} <= keep
    # whatever comes next, the rule's choice is among the kept epochs
    for extra in [(0.99, 3.0), (0.91, 0.1), (1.0, 0.95), (0.93, 0.4)]:
        more = recs + [EstimatedEpoch(len(recs) + 1, *extra)]
        assert pick_epoch(more) in could_be_picked(recs) | {len(more)}


def test_analysis_reports_the_selected_row_not_the_last():
    import pandas as pd

    from analysis.results import final_rows
    from tests.synthetic import frame, trial

    picked = trial(lam=1.0, epochs=3, test_acc=0.6, mi_eval=2.0, trial_id="a")
    plain = trial(lam=0.0, epochs=3, test_acc=0.3, mi_eval=3.0, trial_id="b")
    df = frame(picked + plain)
    df["selected"] = [False, True, False, False, False, True]  # a: epoch 2; b: its last
    df.loc[(df["trial_id"] == "a") & (df["epoch"] == 2), "mi_eval"] = 1.5
    finals = final_rows(df).set_index("trial_id")
    assert finals.loc["a", "epoch"] == 2 and finals.loc["a", "mi_eval"] == 1.5
    assert finals.loc["b", "epoch"] == 3
    # without the column (older results) the last epoch is the final row
    finals_old = final_rows(df.drop(columns="selected")).set_index("trial_id")
    assert finals_old.loc["a", "epoch"] == 3
    assert isinstance(finals_old, pd.DataFrame)


def test_table_md_says_its_cells_are_the_reported_epoch_when_a_rule_picked_one():
    from analysis.results import final_rows
    from analysis.tables import build_tables
    from tests.synthetic import frame, trial

    df = frame(trial(lam=1.0, epochs=3, trial_id="a") + trial(lam=0.0, epochs=3, trial_id="b"))
    _, plain_md = build_tables(df, final_rows(df))
    assert "final-epoch value" in plain_md and "reported epoch" not in plain_md
    df["selected"] = [False, True, False, False, False, True]
    _, picked_md = build_tables(df, final_rows(df))
    assert "reported epoch" in picked_md and "final-epoch value" not in picked_md


# -- a sound stopping rule ---------------------------------------------------------------

def test_nan_or_infinite_estimates_are_never_picked_and_never_crash():
    nan, inf = float("nan"), float("inf")
    recs = _records([(0.95, 1.0), (0.96, nan), (0.97, -inf), (0.97, 1.4)])
    assert pick_epoch(recs) == 1
    assert not {2, 3} & could_be_picked(recs)
    # nothing usable: None, and the trial reports its last epoch with a note
    assert pick_epoch(_records([(0.9, nan), (0.95, inf)])) is None
    assert could_be_picked(_records([(0.9, nan)])) == set()
    # a NaN train accuracy is not usable either (and does not set the best)
    assert pick_epoch(_records([(nan, 0.1), (0.9, 1.0)])) == 2


def test_an_estimate_below_its_prediction_floor_is_an_estimator_failure():
    # full MNIST, seed 7: mi_eval ~0 on a model that fits the labels, below the ~1.9 nats
    # the same estimator reads on its one-hot predictions (a function of z).
    recs = [EstimatedEpoch(1, 0.95, 2.4, floor=1.8), EstimatedEpoch(2, 0.96, 1.6, floor=1.8),
            EstimatedEpoch(3, 0.97, 0.0, floor=1.8), EstimatedEpoch(4, 0.97, -0.01, floor=1.7)]
    assert recs[2].estimator_failed() and not recs[1].estimator_failed()
    assert pick_epoch(recs) == 2  # within the margin of its floor: a sound low estimate
    assert could_be_picked(recs) == {2}
    # the conditional rule checks the conditional floor
    cond = [EstimatedEpoch(1, 0.95, 2.0, 0.9, floor_cond=0.2),
            EstimatedEpoch(2, 0.96, 2.0, -0.9, floor_cond=0.2)]
    assert pick_epoch(cond, criterion="mi_eval_cond") == 1
    # ... and the plain one: seed 7's failed epochs read ~0 on both, and ~0 is the
    # conditional floor, so only mi_eval's floor shows the estimator failing on that z
    seed7 = [EstimatedEpoch(9, 0.97, 1.57, 0.37, 1.8, 0.05),
             EstimatedEpoch(11, 0.69 + 0.2, -0.00, -0.00, 1.8, 0.0)]
    assert pick_epoch(seed7, criterion="mi_eval_cond") == 9
    # no floor measured (NaN): no check
    assert pick_epoch(_records([(0.9, 5.0), (0.9, -3.0)])) == 2


def test_the_pick_is_always_among_the_kept_epochs_even_for_near_ties():
    """Pruning and picking use the same comparisons: a history with estimates that differ
    by less than any tolerance used to pick an epoch whose weights were dropped."""
    import random

    rng = random.Random(0)
    for criterion in ("mi_eval", "mi_eval_cond"):
        for _ in range(300):
            kept: set[int] = set()
            recs: list[EstimatedEpoch] = []
            base = rng.choice([1.0, 0.3])
            for epoch in range(1, rng.randint(2, 12)):
                value = base + rng.choice([0.0, 1e-10, -1e-10, 2e-9, 0.5, -0.5,
                                           float("nan")])
                acc = rng.choice([0.9, 0.92, 0.95, 0.95 + 1e-13, 0.99])
                floor = rng.choice([float("nan"), 0.0, 1.5])
                recs.append(EstimatedEpoch(epoch, acc, value, value, floor, floor))
                kept = (kept | {epoch}) & could_be_picked(recs, criterion)
                chosen = pick_epoch(recs, criterion=criterion)
                assert chosen is None or chosen in kept, (recs, chosen, kept)


def test_old_checkpoint_records_still_load():
    old = {"epoch": 3, "train_acc": 0.9, "mi_eval": 1.2}  # written before the floors
    rec = EstimatedEpoch(**old)
    assert rec.usable("mi_eval") and not rec.usable("mi_eval_cond")


def test_the_reported_mi_is_the_independent_re_estimate_and_warnings_reach_the_table():
    from analysis.results import critic_warning, final_rows
    from analysis.tables import build_tables
    from tests.synthetic import frame, trial

    picked = trial(lam=1.0, epochs=3, test_acc=0.6, mi_eval=2.0, trial_id="a")
    plain = trial(lam=0.0, epochs=3, test_acc=0.3, mi_eval=3.0, trial_id="b")
    df = frame(picked + plain)
    df["selected"] = [False, True, False, False, False, True]
    df.loc[(df["trial_id"] == "a") & (df["epoch"] == 2), "mi_eval"] = 1.5  # the minimum
    df["selected_mi_eval"] = float("nan")
    df.loc[(df["trial_id"] == "a") & (df["epoch"] == 3), "selected_mi_eval"] = 1.9
    finals = final_rows(df).set_index("trial_id")
    assert finals.loc["a", "mi_eval"] == 1.9 and finals.loc["a", "mi_eval_at_selection"] == 1.5
    assert finals.loc["b", "mi_eval"] == 3.0  # no re-estimate (reports its last epoch)

    # a trial whose own DV estimate ran far below 0 says so
    a = df[df["trial_id"] == "a"].copy()
    assert critic_warning(a) == ""
    a.loc[a["epoch"] == 2, "mi"] = -25.0
    a.loc[a["epoch"] == 3, "mi"] = -768.0
    warning = critic_warning(a)
    assert "from epoch 2" in warning and "-768.0 at epoch 3" in warning
    df.loc[df["trial_id"] == "a", "status"] = "ok; " + warning
    _, markdown = build_tables(df, final_rows(df))
    section = markdown.split("## Trials with a warning")[1]
    assert "own critic ran away" in section and "| a |" in section
