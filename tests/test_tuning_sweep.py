"""A tuning sweep end to end on the session's Ray: the screen on seed 0, the comparison it
writes, the rows of one rule's pick on another seed (the same drawn settings), and a resume
under another search seed refused before Ray."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from conftest import ONE_AT_A_TIME, SMALL_NET
from drivers import run_sweep

pytestmark = pytest.mark.ray

TINY = ["--preset", "tune_quick", "--arms", "erm,group_dro", "--draws", "2", "--epochs", "1",
        "--batch-size", "256", "--mi-eval-steps", "20", "--device", "cpu", *SMALL_NET,
        *ONE_AT_A_TIME]


def test_a_screen_then_a_picks_rows_on_another_seed(ray_local, tmp_path):
    screen = tmp_path / "screen"
    ran = run_sweep("digits", *TINY, "--out", str(screen))
    assert ran.returncode == 0, ran.stderr
    df = pd.read_parquet(screen / "results.parquet")
    assert sorted(set(zip(df["arm"], df["draw"], strict=True))) == [
        ("erm", 0), ("erm", 1), ("group_dro", 0), ("group_dro", 1)]
    assert {"val_acc", "val_worst_acc", "test_worst_acc"} <= set(df.columns)
    assert df["val_acc"].notna().all() and df["test_worst_acc"].notna().all()
    text = (screen / "comparison.md").read_text()
    assert "validation worst-group accuracy" in text and "--draw-of" in text
    table = pd.read_parquet(screen / "comparison.parquet")
    pick = int(table[(table["rule"] == "val_acc") & (table["arm"] == "group_dro")]["draw"]
               .iloc[0])

    rows = tmp_path / "rows"
    ran = run_sweep("digits", *TINY, "--seeds", "1", "--arms", "group_dro", "--draw-of",
                    f"group_dro={pick}", "--out", str(rows))
    assert ran.returncode == 0, ran.stderr
    again = pd.read_parquet(rows / "results.parquet")
    assert set(again["draw"]) == {pick} and set(again["seed"]) == {1}
    drawn = ("lr", "weight_decay", "dro_step", "sampler")
    screen_config = json.loads(df[(df["arm"] == "group_dro") & (df["draw"] == pick)]
                               ["config"].iloc[0])
    rows_config = json.loads(again["config"].iloc[0])
    assert {k: rows_config[k] for k in drawn} == {k: screen_config[k] for k in drawn}

    from analysis.comparison import compare, load_rows

    both = compare(load_rows([screen, rows]))
    cell = both[(both["rule"] == "val_acc") & (both["arm"] == "group_dro")].iloc[0]
    assert cell["n_rows"] == 1
    assert cell["test_acc_mean"] == pytest.approx(float(again["test_acc"].iloc[-1]))
    # what bench/results keeps: the exported CSVs give the same comparison
    csvs = [tmp_path / "screen.csv", tmp_path / "rows.csv"]
    for out, csv in zip((screen, rows), csvs, strict=True):
        assert run_sweep("export", str(out), str(csv)).returncode == 0
    exported = pd.read_csv(csvs[0])
    assert len(exported) == len(df) and {"arm", "draw"} <= set(exported.columns)
    from_csv = compare(load_rows(csvs))
    assert set(both.columns) - set(from_csv.columns) <= {"benchmark"}  # a CSV names none
    pd.testing.assert_frame_equal(from_csv, both[from_csv.columns], check_dtype=False)

    refused = run_sweep("digits", *TINY, "--search-seed", "1", "--resume", "--out",
                        str(screen))
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines()[-1].startswith("error: the record of trial")
    assert "--search-seed" in refused.stderr
