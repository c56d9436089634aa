"""`--bundle N`: grid points trained as one Tune trial (unbiased/trial.py), with the
results contract of one trial per point."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from sweeps.core import bundle_points
from sweeps.digits_grid import main as main_digits
from tests.conftest import ONE_AT_A_TIME
from tests.drivers import run_main

SMALL = ["--width", "8", "--train-eval-rows", "500"]
TINY = ["--seeds", "0", "--epochs", "2", "--K", "2", "--batch-size", "256",
        "--mi-eval-steps", "30", "--device", "cpu", *SMALL]


def _point(lam, seed=0, sigma=0.03, method="mi_backprop", K=2):
    point = {"sigma": sigma, "method": method, "lam": lam, "seed": seed}
    return {**point, "K": K} if method == "mi_backprop" else point


def test_points_that_share_their_settings_go_into_bundles_in_grid_order():
    fixed = {"inner_z": "batch", "batch_size": 64}
    points = [_point(0.0), _point(1.0), _point(0.0, sigma=0.045), _point(1.0, K=4),
              _point(1.0, method="hsic"), _point(1.0, sigma=0.045), _point(0.5, seed=1)]
    trials = bundle_points(points, 3, fixed)
    assert trials == [{"members": [points[0], points[1], points[2]]}, points[3], points[4],
                      {"members": [points[5], points[6]]}]
    assert bundle_points(points, 1, fixed) == points
    # inner z other than "batch": no bundle
    assert bundle_points(points, 3, {**fixed, "inner_z": "fresh"}) == points


@pytest.mark.ray
def test_dry_run_shows_which_trial_each_point_trains_in(tmp_path):
    ran = run_main("digits_grid", "--sigma", "0.03,0.045", "--lam", "0,0.5,1", "--bundle", "4",
                   *TINY, "--inner-z", "batch", "--dry-run", "--out", str(tmp_path / "o"))
    assert ran.returncode == 0, ran.stderr
    assert "6 trials" in ran.stdout and "2 Tune trials (--bundle 4)" in ran.stdout
    table = ran.stdout.splitlines()[1:8]
    assert table[0].split()[0] == "bundle"
    assert [line.split()[0] for line in table[1:]] == ["0", "0", "0", "0", "1", "1"]


@pytest.mark.ray
def test_a_grid_with_nothing_to_bundle_says_so(tmp_path):
    ran = run_main("digits_grid", "--lam", "0,1", "--bundle", "2", *TINY, "--inner-z", "fresh",
                   "--dry-run", "--out", str(tmp_path / "o"))
    assert ran.returncode == 0
    assert "--bundle 2: no two trials can share one" in ran.stdout
    assert "Tune trials" not in ran.stdout


@pytest.mark.ray
@pytest.mark.parametrize(("args", "needle"), [
    (["--bundle", "0"], "argument --bundle"),
    (["--bundle", "2", "--scheduler", "asha"], "ASHA stops trials one by one"),
])
def test_a_bundle_that_cannot_run_is_one_error_line(args, needle, tmp_path):
    ran = run_main("digits_grid", *args, "--out", str(tmp_path / "o"))
    assert ran.returncode == 2
    assert needle in ran.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "o").exists()


@pytest.mark.ray
@pytest.mark.system  # trackers
def test_a_bundled_sweep_writes_a_trial_per_point_and_logs_a_run_per_point(
        ray_local, tmp_path, capsys, monkeypatch):
    """Bundles beside plain trials (hsic's, and a bundle of one point), logged to MLflow's
    local store and to W&B offline where its extra is installed: each grid point is a trial
    in results.parquet and a run in each tracker, bundled or not."""
    import shlex
    from pathlib import Path

    from mlflow.tracking import MlflowClient

    from tests.test_tracking import _check_histories, _trackers, _trial_runs

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    trackers = _trackers()
    out = tmp_path / "digits"
    rc = main_digits(["--sigma", "0.03,0.045", "--lam", "0,1", "--method", "mi_backprop,hsic",
                      "--bundle", "3", "--inner-z", "batch", *TINY, *ONE_AT_A_TIME,
                      "--tracker", trackers, "--out", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "6 trials" in printed and "4 Tune trials (--bundle 3)" in printed
    df = pd.read_parquet(out / "results.parquet")
    # 4 mi_backprop points (two bundles: 3 and 1 point) and 2 hsic trials, 2 epochs each
    assert len(df) == 12 and df["trial_id"].nunique() == 6
    assert all(sorted(epochs) == [1, 2] for _, epochs in df.groupby("trial_id")["epoch"])
    assert df.groupby("trial_id")["selected"].sum().eq(1).all()
    # every row's trial_id is its point's record key, bundled or not
    assert set(df["trial_id"]) == {f"sigma={s}_method={m}_lam={lam}_seed=0" + ("_K=2" if m ==
                                   "mi_backprop" else "") for s in (0.03, 0.045)
                                   for m, lams in (("mi_backprop", (0.0, 1.0)), ("hsic", (1.0,)))
                                   for lam in lams}
    members = df[df["method"] == "mi_backprop"]
    assert members["trial_id"].nunique() == 4
    for _, row in members.iterrows():  # each member's own config, lam and sigma
        config = json.loads(row["config"])
        assert "members" not in config
        assert (config["lam"], config["sigma"]) == (row["lam"], row["sigma"])
    assert members[members["epoch"] == 2]["mi_eval"].notna().all()
    assert set(df["status"]) <= {"ok"} | {s for s in df["status"] if s.startswith("ok")}
    assert "lam=1.0 K=2 seed=0: epoch 2/2" in printed  # a progress line per member
    assert (out / "table.md").is_file()

    # The last lines say how to look at the sweep, with commands that work on OUT as written.
    lines = printed.strip().splitlines()
    if "wandb" in trackers:  # W&B: an offline run per grid point, its histories its rows
        from tests.test_wandb import check_offline_runs

        wandb_line = lines.pop()
        assert wandb_line.startswith(f"W&B: offline runs in {out / 'wandb'}; upload: wandb sync ")
        check_offline_runs(out, df)
    tensorboard, ui = lines[-2:]
    logdir = Path(shlex.split(tensorboard.split(": ", 1)[1])[-1])
    assert tensorboard.startswith("TensorBoard: tensorboard --logdir ")
    assert any(logdir.rglob("events.out.tfevents.*"))  # Tune's event files, not /tmp/ray
    assert ui.startswith("MLflow: mlflow ui --backend-store-uri ")

    # MLflow: a nested run per grid point, its histories, tags and params its trial's
    client = MlflowClient(tracking_uri=shlex.split(ui)[-1])
    parent, runs = _trial_runs(client, out)
    assert len(runs) == df["trial_id"].nunique()
    _check_histories(client, runs, df)
    for run in runs:
        tags, params = run.data.tags, run.data.params
        rows = df[df["trial_id"] == tags["trial_id"]]
        assert float(tags["lam"]) == rows["lam"].iloc[0] == float(params["lam"])
        assert tags["method"] == rows["method"].iloc[0]
        assert float(tags["sigma"]) == rows["sigma"].iloc[0]
        assert tags["seed"] == "0" and params["epochs"] == "2"
        assert params["batch_size"] == "256"  # the whole flat config, not only the point
        assert int(tags["selected_epoch"]) == int(rows.loc[rows["selected"], "epoch"].iloc[0])
        assert run.info.status == "FINISHED"
    names = {a.path for a in client.list_artifacts(parent)}
    assert {"results.parquet", "table.md", "table.parquet", "figures"} <= names
    assert client.list_artifacts(parent, "figures")
    assert client.get_run(parent).info.status == "FINISHED"


# A bundle SIGKILLed mid-epoch resumes every member from its checkpoint: test_reliability.py's
# killed sweep, whose trial still running is a bundle.


def test_a_bundle_trial_reads_as_a_trial_per_member():
    # Each member's own columns, its epochs, its key; a device error stops every member.
    from sweeps.finished_trials import trial_points

    config = {"epochs": 2, "members": [{"lam": 0.0}, {"lam": 1.0}]}
    df = pd.DataFrame({"epoch": [1, 2], "m0/epoch": [1, 2], "m0/train_acc": [.5, .6],
                       "m1/epoch": [1, None], "m1/diverged": ["diverged at epoch 1", None]})
    (ia, ca, a), (ib, cb, b) = trial_points(df, config, "lam=0.0+1")
    assert (ia, ib) == ("lam=0.0", "lam=1.0")  # each member's own record key
    assert ca == {"epochs": 2, "lam": 0.0} and cb == {"epochs": 2, "lam": 1.0}
    assert list(a["epoch"]) == [1, 2] and list(a["train_acc"]) == [.5, .6]
    assert list(b["epoch"]) == [1] and b["diverged"].iloc[0].startswith("diverged")
    failed = pd.DataFrame({"epoch": [0], "device_error": ["device 'cuda' with GPUs [0]"]})
    for _, _, own in trial_points(failed, config, "lam=0.0+1"):
        assert list(own["epoch"]) == [0] and own["device_error"].iloc[0].startswith("device")
    assert trial_points(df, {"lam": 1.0}, "t") == [("t", {"lam": 1.0}, df)]
