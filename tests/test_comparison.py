"""The comparison of a tuning sweep (analysis/comparison.py) on hand-made rows where each rule
picks another draw and another epoch: each rule reads only what it says it reads, and an arm's
row is its pick on the seeds the rule did not pick on."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest

from analysis.comparison import RULES, compare, comparison_markdown, load_rows

RULE = {rule.key: rule for rule in RULES}


def _trial(arm: str, draw: int, seed: int, epochs: list[dict], lam: float = 0.0,
           selected: int | None = None) -> list[dict]:
    last = len(epochs)
    config = json.dumps({"lr": 0.001 * (draw + 1), "seed": seed, "arm": arm, "draw": draw})
    return [{"benchmark": "digits", "sigma": 0.03, "arm": arm, "draw": draw, "seed": seed,
             "method": "group_reweight", "lam": lam, "epoch": i + 1, "epochs": last,
             "mi": float("nan"), "status": "ok", "config": config,
             "selected": (i + 1) == (selected or last), **values}
            for i, values in enumerate(epochs)]


def _epoch(train=0.9, test=0.5, worst=0.2, val=0.8, val_worst=0.3, mi=0.5) -> dict:
    return {"train_acc": train, "test_acc": test, "test_worst_acc": worst, "val_acc": val,
            "val_worst_acc": val_worst, "mi_eval": mi, "mi_floor": 0.0,
            "mi_eval_cond": 0.1, "mi_floor_cond": 0.0}


def _rows() -> pd.DataFrame:
    rows = []
    for seed in (0, 1, 2):
        shift = 0.01 * seed
        # draw 0: best validation accuracy at epoch 1, lowest MI, a weak worst group
        rows += _trial("erm", 0, seed, [_epoch(val=0.95, test=0.40 + shift, mi=0.2),
                                        _epoch(val=0.90, test=0.45 + shift, mi=0.1)])
        # draw 1: best validation worst group (epoch 2), best test at epoch 1
        rows += _trial("erm", 1, seed, [_epoch(val=0.85, val_worst=0.5, test=0.70 + shift),
                                        _epoch(val=0.88, val_worst=0.6, test=0.60 + shift)])
        # draw 2: does not fit the training data, the lowest MI of all
        rows += _trial("erm", 2, seed, [_epoch(train=0.5, mi=0.01, val=0.5),
                                        _epoch(train=0.6, mi=0.0, val=0.5)])
    return pd.DataFrame(rows)


def _cell(table: pd.DataFrame, rule: str) -> pd.Series:
    return table[(table["rule"] == rule) & (table["arm"] == "erm")].iloc[0]


def test_each_rule_picks_its_own_draw_on_the_screen_seed_and_reports_the_other_seeds():
    table = compare(_rows(), screen_seeds=[0])
    val, worst, oracle, mi = (_cell(table, k) for k in ("val_acc", "val_worst", "oracle",
                                                         "lowest_mi"))
    assert (val["draw"], worst["draw"], oracle["draw"]) == (0, 1, 1)
    # the validation rule reads epoch 1 of draw 0 on seeds 1 and 2: test .41, .42
    assert val["test_acc_mean"] == pytest.approx(0.415)
    assert val["screen_test_acc"] == pytest.approx(0.40)
    # the worst-group rule reads epoch 2 of draw 1 (val worst .6), the oracle epoch 1
    assert worst["test_acc_mean"] == pytest.approx(0.615)
    assert oracle["test_acc_mean"] == pytest.approx(0.715)
    assert val["n_rows"] == 2 and val["row_seeds"] == "1,2"
    # the lowest-MI rule passes over draw 2, which does not fit, and reads the last epoch
    assert mi["draw"] == 0 and mi["test_acc_mean"] == pytest.approx(0.465)
    assert val["settings"] == "lr 0.001"


def test_a_failed_mi_estimate_or_a_diverged_trial_is_not_a_candidate():
    rows = _rows()
    # draw 0's estimate on the screen seed reads far below its floor: the estimator failed
    rows.loc[(rows["draw"] == 0) & (rows["seed"] == 0), "mi_floor"] = 3.0
    assert _cell(compare(rows), "lowest_mi")["draw"] == 1
    rows = _rows()
    rows.loc[(rows["draw"] == 1) & (rows["seed"] == 0), "status"] = "diverged at epoch 2"
    assert _cell(compare(rows), "val_worst")["draw"] == 0


def test_the_markdown_names_each_rule_and_the_command_for_rows_not_run():
    rows = _rows()
    screen_only = rows[rows["seed"] == 0]
    table = compare(screen_only)
    text = comparison_markdown(table, {"erm": "ERM"}, "python -m sweeps digits --preset tune",
                               "1,2,3")
    for rule in RULES:
        assert rule.name in text
    assert "oracle (peeks at test labels)" in text
    assert "| ERM | 1 |" in text and "not run" in text
    assert ("python -m sweeps digits --preset tune --seeds 1,2,3 --arms erm "
            "--draw-of erm=0,1`") in text


def test_the_command_line_reads_csvs_and_says_what_is_wrong(tmp_path):
    csv = tmp_path / "rows.csv"
    _rows().to_csv(csv, index=False)
    out = tmp_path / "out"
    run = subprocess.run([sys.executable, "-m", "analysis.comparison", str(csv), "--out",
                          str(out)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert load_rows([csv]).shape[0] == len(_rows())
    flags = subprocess.run([sys.executable, "-m", "analysis.comparison", str(csv),
                            "--rows-flags"], capture_output=True, text=True, timeout=120)
    assert flags.stdout.strip() == "--arms erm --draw-of erm=0,1"
    assert (out / "comparison.md").read_text().count("## ") == len(RULES)
    bad = tmp_path / "bad.csv"
    pd.DataFrame({"epoch": [1], "seed": [0]}).to_csv(bad, index=False)
    run = subprocess.run([sys.executable, "-m", "analysis.comparison", str(bad), "--out",
                          str(tmp_path / "out2")], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        "error: no column arm, draw: not a tuning sweep's rows (the `tune` presets, --arms)"]
    assert not (tmp_path / "out2").exists()


def test_draws_level_on_the_worst_group_go_to_the_one_with_the_best_validation_accuracy():
    rows = _rows()
    # every trial's validation worst group at 0, as on Biased MNIST at rho .997 (rare groups of
    # one or two rows): the tie goes to validation accuracy, as it does between epochs
    rows["val_worst_acc"] = 0.0
    rows.loc[rows["draw"] == 1, "val_acc"] = 0.99
    worst = _cell(compare(rows), "val_worst")
    assert worst["draw"] == 1
    assert "3 of them level: val_acc 0.9900 breaks the tie" in worst["reason"]
    assert "level" not in _cell(compare(_rows()), "val_worst")["reason"]


def test_a_trial_still_running_is_no_candidate_in_an_exported_csv_too(tmp_path):
    # an exported CSV has no `epochs` column: the trial's config says how many it runs
    rows = _rows()
    rows["config"] = [json.dumps({**json.loads(c), "epochs": 2}) for c in rows["config"]]
    # draw 1 on the screen seed has run epoch 1 of 2, its best test accuracy: not yet a pick
    rows = rows[~((rows["draw"] == 1) & (rows["seed"] == 0) & (rows["epoch"] == 2))]
    csv = tmp_path / "screen.csv"
    rows.drop(columns=["epochs"]).to_csv(csv, index=False)
    assert _cell(compare(_rows()), "oracle")["draw"] == 1  # once whole
    assert _cell(compare(load_rows([csv])), "oracle")["draw"] == 2  # the best whole draw
    assert _cell(compare(rows), "oracle")["draw"] == 2
