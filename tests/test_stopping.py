"""The label-free stopping rule over epochs (unbiased/stopping.py)."""

from __future__ import annotations

import pytest

from unbiased.stopping import EpochRecord, could_be_picked, pick_epoch


def _records(rows: list[tuple[float, float]]) -> list[EpochRecord]:
    return [EpochRecord(i + 1, acc, mi) for i, (acc, mi) in enumerate(rows)]


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
        more = recs + [EpochRecord(len(recs) + 1, *extra)]
        assert pick_epoch(more) in could_be_picked(recs) | {len(more)}


def test_analysis_reports_the_selected_row_not_the_last():
    import pandas as pd

    from analysis.results import final_rows
    from analysis.synthetic import frame, trial

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
