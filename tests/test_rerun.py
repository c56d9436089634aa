"""`python -m sweeps rerun OUT --seeds`: the label-free picks of a sweep on new seeds."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import ONE_AT_A_TIME, SMALL_NET
from tests.drivers import run_main

# Each test runs a sweep driver or a Ray: the integration tier.
pytestmark = pytest.mark.ray

ROOT = Path(__file__).resolve().parents[1]
# The re-run takes the source's recorded config, the small net (tests/conftest.py) with it.
TINY = ["--sigma", "0.03", "--K", "2", "--batch-size", "256", "--mi-eval-steps", "20",
        "--device", "cpu", *ONE_AT_A_TIME, "--epochs", "1", *SMALL_NET]


def _config(row: pd.Series) -> dict:
    config = json.loads(row["config"])
    config.pop("seed")
    return config


def test_rerun_runs_each_rules_pick_on_the_new_seeds_with_the_source_config(ray_local,
                                                                           tmp_path):
    from sweeps.digits_grid import main as digits
    from sweeps.rerun import main as rerun

    source = tmp_path / "source"
    assert digits([*TINY, "--lam", "0,0.5,1", "--seeds", "0", "--out", str(source)]) == 0
    new = tmp_path / "new"
    assert rerun([str(source), "--seeds", "3,4", "--out", str(new)]) == 0

    table = pd.read_parquet(new / "rerun.parquet")
    rules = set(table["rule"])
    assert {"lowest-MI (label-free)", "highest-fitting-λ (label-free)",
            "ERM (λ=0), reference"} == rules  # the oracle peeks at test labels: not re-run
    assert (table["source"] == str(source)).all()
    df = pd.read_parquet(new / "results.parquet")
    assert set(df["seed"]) == {3, 4}
    # exactly the picked lambdas run (each once, however many rules chose it)
    assert set(df["lam"]) == set(table["lam"])
    assert df["trial_id"].nunique() == 2 * table["lam"].nunique()
    # everything but the seed is the source's recorded config
    old = pd.read_parquet(source / "results.parquet")
    for lam in set(table["lam"]):
        before = _config(old[old["lam"] == lam].iloc[0])
        for _, row in df[df["lam"] == lam].iterrows():
            assert _config(row) == before
    # each row's new-seed mean is that configuration's mean over the new seeds
    for pick in table.itertuples():
        rows = df[(df["lam"] == pick.lam) & df["selected"]]
        assert pick.n == 2 and abs(pick.test_acc - rows["test_acc"].mean()) < 1e-12
        sel = old[(old["lam"] == pick.lam) & old["selected"]]
        assert abs(pick.sel_test_acc - sel["test_acc"].mean()) < 1e-12
    text = (new / "rerun.md").read_text()
    assert str(source) in text and "lowest-MI (label-free)" in text
    record = json.loads((new / "experiment.json").read_text())
    assert record["rerun_of"]["source"] == str(source.resolve())
    assert record["values"]["seeds"] == [3, 4]


def test_rerun_of_a_directory_without_a_sweep_is_one_line(tmp_path):
    proc = run_main("__main__", "rerun", str(tmp_path), "--seeds", "1")  # tests/drivers.py
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "experiment.json" in lines[0]


def test_rerun_help():
    proc = run_main("__main__", "rerun", "--help")
    assert proc.returncode == 0 and "--seeds" in proc.stdout and "source" in proc.stdout
