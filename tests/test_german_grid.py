"""The German grid (`python -m sweeps german`): flag validation, bad data root, SVM rows, a
tiny end-to-end sweep."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from tests.conftest import ONE_AT_A_TIME
from tests.drivers import Ran, run_sweep


def _run(*args: str) -> Ran:
    """The driver's checks before Ray, in this process (tests/drivers.py)."""
    return run_sweep("german", *args)


@pytest.mark.ray
@pytest.mark.parametrize("args, needle", [
    (["--preset", "huge"], "--preset"),
    (["--lam", "-1"], "--lam"),
    (["--K", "0"], "--K"),
    (["--sigma", "0.02"], "--sigma"),  # German has no sigma
    (["--seeds", "a"], "--seeds"),
])
def test_bad_flag_is_one_line_naming_it(args, needle, tmp_path):
    proc = _run(*args, "--out", str(tmp_path / "out"))
    assert proc.returncode == 2
    assert needle in proc.stderr.strip().splitlines()[-1] and "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.ray
def test_missing_data_root_is_one_line_before_ray_starts(tmp_path):
    proc = _run("--root", str(tmp_path / "nowhere"), "--out", str(tmp_path / "out"))
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert "--root" in last and "does not exist" in last and "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.ray
def test_help_lists_both_presets():
    proc = _run("--help")
    assert proc.returncode == 0
    assert "quick" in proc.stdout and "paper" in proc.stdout and "--sigma" not in proc.stdout


def test_presets_keep_the_papers_german_settings():
    from unbiased.benchmarks.german.spec import GERMAN

    paper = GERMAN["paper"]
    assert paper["lam"] == [0.0, 0.1, 0.5, 1.0, 2.0] and paper["seeds"] == list(range(10))
    assert (paper["epochs"], paper["batch_size"], paper["K"], paper["lr"]) == (500, 64, 30, 1e-5)
    assert (paper["mine_optimizer"], paper["mine_lr"]) == ("sgd", 0.1)
    assert (paper["mine_hidden"], paper["mine_hidden_layers"]) == (64, 1)
    assert (paper["cpus_per_trial"], paper["gpus_per_trial"]) == (1.0, 0.0)
    assert GERMAN["quick"]["lam"] == [0.0, 1.0]


def test_svm_rows_follow_the_results_contract():
    from unbiased.benchmarks.german.spec import SvmResult, svm_rows

    like = pd.DataFrame({"experiment": ["german_grid"], "lam": [1.0], "K": [30], "seed": [0],
                         "epoch": [2], "eo": [0.1], "status": pd.array(["ok"], "string")})
    rows = svm_rows([SvmResult(seed=3, C=1.0, cv_acc=0.75, train_acc=0.9, test_acc=0.74,
                               eo=0.05, time_s=0.5)], like)
    assert list(rows.columns[:len(like.columns)]) == list(like.columns)
    row = rows.iloc[0]
    assert row["method"] == "svm" and math.isnan(row["lam"]) and row["K"] == 0
    assert (row["seed"], row["epoch"], row["eo"], row["status"]) == (3, 1, 0.05, "ok")
    assert math.isnan(row["mi"]) and math.isnan(row["mi_eval"])
    assert rows["K"].dtype == "int64" and rows["lam"].dtype == "float64"


@pytest.mark.ray
def test_tiny_sweep_writes_the_results_contract_with_svm_rows(ray_local, tmp_path):
    from sweeps.__main__ import main

    out = tmp_path / "german"
    rc = main(["german", "--lam", "0,1", "--seeds", "0", "--epochs", "2", "--K", "2",
               "--mi-eval-steps", "20", *ONE_AT_A_TIME, "--out", str(out)])
    assert rc == 0
    df = pd.read_parquet(out / "results.parquet")
    for col in ["experiment", "trial_id", "benchmark", "method", "sigma", "lam", "K", "seed",
                "epoch", "mi", "train_acc", "test_acc", "time_s", "mi_eval", "eo"]:
        assert col in df.columns, col
    assert (df["benchmark"] == "german").all() and df["sigma"].isna().all()
    mi = df[df["method"] == "mi_backprop"]
    assert len(mi) == 4  # 2 trials x 2 epochs
    assert sorted(mi["lam"].unique()) == [0.0, 1.0]
    assert mi["eo"].between(0, 1).all()
    assert mi[mi["epoch"] == 2]["mi_eval"].notna().all()
    assert mi[mi["epoch"] == 1]["mi_eval"].isna().all()
    svm = df[df["method"] == "svm"]
    assert len(svm) == 1 and svm["lam"].isna().all() and (svm["K"] == 0).all()
    assert svm["test_acc"].gt(0.6).all() and svm["eo"].between(0, 1).all()
    assert (svm["status"] == "ok").all() and svm["mi_eval"].isna().all()
    assert (out / "table.md").exists() and (out / "table.parquet").exists()
    assert json.loads((out / "experiment.json").read_text())["experiment"] == "german_grid"
