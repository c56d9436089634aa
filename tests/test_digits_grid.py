"""The digits driver: flag validation (one line, exit 2) and a tiny end-to-end sweep."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
DRIVER = ROOT / "sweeps" / "digits_grid.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(DRIVER), *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)


@pytest.mark.parametrize("args, needle", [
    (["--preset", "huge"], "--preset"),
    (["--lam", "-1"], "--lam"),
    (["--lam", "0,,1"], "--lam"),
    (["--K", "0"], "--K"),
    (["--sigma", "1.5"], "--sigma"),
    (["--epochs", "0"], "--epochs"),
    (["--seeds", "a,b"], "--seeds"),
    (["--inner-z", "bank?"], "--inner-z"),
    (["--theta-update", "both"], "--theta-update"),
    (["--mine-ema-rate", "1.5"], "--mine-ema-rate"),
    (["--select-epoch", "best_test"], "--select-epoch"),
    (["--width", "0"], "--width"),
])
def test_bad_flag_is_one_line_naming_it(args, needle, tmp_path):
    proc = _run(*args, "--out", str(tmp_path / "out"))
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert needle in last and "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()


def test_existing_results_are_not_overwritten_without_a_flag(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "experiment.json").write_text(json.dumps({"experiment": "digits_grid"}))
    proc = _run("--out", str(out), "--epochs", "1")
    assert proc.returncode == 2
    assert "--resume" in proc.stderr and "Traceback" not in proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["experiment.json"]


def test_help_explains_presets():
    proc = _run("--help")
    assert proc.returncode == 0
    assert "quick" in proc.stdout and "paper" in proc.stdout and "--storage-path" in proc.stdout


def test_tiny_sweep_writes_the_results_contract(ray_local, tmp_path):
    from sweeps.digits_grid import main

    out = tmp_path / "digits"
    rc = main(["--sigma", "0.03", "--lam", "0,1", "--seeds", "0", "--epochs", "2", "--K", "2",
               "--batch-size", "256", "--mi-eval-steps", "30", "--device", "cpu",
               "--out", str(out)])
    assert rc == 0
    df = pd.read_parquet(out / "results.parquet")
    for col in ["experiment", "trial_id", "benchmark", "method", "sigma", "lam", "K", "seed",
                "epoch", "mi", "train_acc", "test_acc", "time_s", "mi_eval"]:
        assert col in df.columns, col
    assert len(df) == 4  # 2 trials x 2 epochs
    assert sorted(df["lam"].unique()) == [0.0, 1.0]
    assert (df["benchmark"] == "digits").all() and (df["sigma"] == 0.03).all()
    last = df[df["epoch"] == 2]
    first = df[df["epoch"] == 1]
    assert last["mi_eval"].notna().all() and first["mi_eval"].isna().all()
    # one reported row per trial: the last epoch when no stopping rule is asked for
    assert df.groupby("trial_id")["selected"].sum().eq(1).all()
    assert df.loc[df["selected"], "epoch"].eq(2).all()
    assert last["mi_eval_cond"].notna().all()
    assert (out / "table.md").exists() and (out / "table.parquet").exists()
    assert any((out / "figures").glob("*.png"))
    assert json.loads((out / "experiment.json").read_text())["experiment"] == "digits_grid"


def test_unreachable_address_fails_fast_with_one_line(tmp_path):
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = _run("--address", f"127.0.0.1:{port}", "--out", str(tmp_path / "out"))
    assert proc.returncode == 2
    assert "cannot connect to Ray at --address" in proc.stderr.strip().splitlines()[-1]
    assert "Traceback" not in proc.stderr and not (tmp_path / "out").exists()


def test_every_loop_flag_reaches_the_trial_config():
    from sweeps.cli import build_parser, resolve
    from sweeps.digits_grid import param_space
    from sweeps.presets import DIGITS

    parser = build_parser("digits_grid.py", "d", DIGITS)
    args = resolve(parser, "digits", DIGITS, [
        "--preset", "cpu", "--root", ".", "--theta-update", "joint", "--mine-ema-rate", "0",
        "--mine-hidden-layers", "3", "--no-rescale-mi-grad", "--select-epoch", "last",
        "--z-relu", "--width", "16", "--palette", "distinct", "--channels-last"])
    space = param_space(args.values)
    assert space["theta_update"] == "joint" and space["mine_ema_rate"] is None
    assert space["mine_hidden_layers"] == 3 and space["rescale_mi_grad"] is False
    assert space["select_epoch"] == "last" and space["z_relu"] is True
    assert space["width"] == 16 and space["palette"] == "distinct"
    assert space["channels_last"] is True and space["source"] == "mnist"

