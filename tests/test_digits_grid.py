"""The digits driver: flag validation (one line, exit 2) and a tiny end-to-end sweep."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import ONE_AT_A_TIME, SMALL_NET
from tests.drivers import Ran, run_main

ROOT = Path(__file__).resolve().parents[1]
DRIVER = ROOT / "sweeps" / "digits_grid.py"


def _run(*args: str) -> Ran:
    """The driver's checks before Ray, in this process (tests/drivers.py)."""
    return run_main("digits_grid", *args)


@pytest.mark.ray
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
    (["--method", "mi_backprop,erm2"], "--method"),
    # values each flag accepts but a method's config refuses: caught before Ray starts
    (["--batch-size", "1"], "--batch-size: 1: must be >= 2"),
    (["--inner-z", "bank", "--bank-size", "1"], "--bank-size: 1: must be >= 2"),
    (["--train-eval-rows", "1"], "train_eval_rows must be 0"),
    # a flag no method of the sweep reads would be dropped silently
    (["--method", "hsic", "--mine-ema-rate", "0.01"],
     "--mine-ema-rate is read only by method mi_backprop, and this sweep runs hsic"),
    (["--method", "grad_reversal", "--K", "20"], "--K is read only by method mi_backprop"),
    (["--method", "mi_backprop", "--head-lr", "0.01"],
     "--head-lr is read only by method grad_reversal, confusion"),
    # a value listed twice would run the same trial twice and count it as two seeds
    (["--seeds", "1,1"], "--seeds: 1 is listed twice in '1,1'"),
    (["--lam", "1,1.0"], "--lam: 1.0 is listed twice"),
    (["--sigma", "0.03,0.030"], "--sigma: 0.030 is listed twice"),
    (["--method", "hsic,hsic"], "--method: hsic is listed twice"),
])
def test_bad_flag_is_one_line_naming_it(args, needle, tmp_path):
    proc = _run(*args, "--out", str(tmp_path / "out"))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert needle in lines[-1] and "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()
    if "error: argument" in lines[-1]:  # argparse's: one short usage line, then the error
        assert len(lines) == 2 and lines[0].startswith("usage: ")
    elif "must be" in needle or "read only" in needle:
        # nothing else on stderr: no Ray start, no trial tracebacks
        assert len(lines) == 1 and lines[0].startswith("error: ")


@pytest.mark.ray
def test_a_bad_flag_from_the_shell_is_one_line_and_exit_2(tmp_path):
    # The process the shell sees: exit status 2, and on stderr the error line alone (argparse's
    # usage before its own), no warning or log line; the other checks run in this process.
    for args, first, needle in [(["--train-eval-rows", "1"], "error: ",
                                 "train_eval_rows must be 0"),
                                (["--sigma", "1.5"], "usage: ", "--sigma")]:
        proc = subprocess.run([sys.executable, str(DRIVER), *args, "--out", str(tmp_path / "o")],
                              capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert lines[0].startswith(first) and needle in lines[-1], proc.stderr
        assert sum("error" in line for line in lines) == 1, proc.stderr
        assert len(lines) <= 2, proc.stderr  # one short usage line at most, then the error
        assert not proc.stdout and not (tmp_path / "o").exists()


@pytest.mark.ray
def test_existing_results_are_not_overwritten_without_a_flag(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "experiment.json").write_text(json.dumps({"experiment": "digits_grid"}))
    proc = _run("--out", str(out), "--epochs", "1")
    assert proc.returncode == 2
    assert "--resume" in proc.stderr and "Traceback" not in proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["experiment.json"]


@pytest.mark.ray
def test_dry_run_lists_every_trial_and_starts_nothing(tmp_path):
    out = tmp_path / "out"
    proc = _run("--preset", "cpu", "--method", "mi_backprop,lntl", "--sigma", "0.02,0.03",
                "--mu", "0.2", "--dry-run", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert "6 trials" in lines[0] and "dry run" in lines[0]
    trials = [line.split() for line in lines[2:-1]]
    # per sigma: ERM once (under the first method), mi_backprop and lntl at lam 1
    assert sorted((t[0], t[1], t[2]) for t in trials) == sorted(
        (m, s, lam) for s in ("0.02", "0.03")
        for m, lam in (("mi_backprop", "0.0"), ("mi_backprop", "1.0"), ("lntl", "1.0")))
    assert lines[-1].startswith("shared: ") and "mu=0.2" in lines[-1]
    assert not out.exists() and "ray" not in proc.stderr.lower()


def test_lam_zero_runs_once_per_data_point_and_seed():
    from sweeps.digits_grid import GRID

    values = {"sigma": [0.02, 0.03], "method": ["mi_backprop", "hsic"], "lam": [0.0, 1.0],
              "K": [20, 40, 80], "seeds": [0, 1]}
    points = GRID.points(values)
    zero = [p for p in points if p["lam"] == 0]
    assert len(zero) == 2 * 2  # sigma x seed: not once per method or K
    assert {(p["method"], p.get("K")) for p in zero} == {("mi_backprop", 20)}
    assert len(points) == len(zero) + 2 * 2 * (3 + 1)  # lam 1: mi_backprop per K, hsic


def test_each_method_can_have_its_own_lambdas():
    from sweeps.digits_grid import GRID

    values = {"sigma": [0.03], "method": ["mi_backprop", "lntl", "hsic"], "lam": [0.0, 1.0],
              "K": [80], "seeds": [0], "method_lam": {"lntl": [0.0, 0.01, 0.1]}}
    got = [(p["method"], p["lam"]) for p in GRID.points(values)]
    # lam 0 (ERM) still once, from --lam; lntl's own list replaces lam 1; hsic keeps --lam's
    assert got == [("mi_backprop", 0.0), ("mi_backprop", 1.0), ("lntl", 0.01),
                   ("lntl", 0.1), ("hsic", 1.0)]


def test_grid_runs_seed_by_seed_and_the_first_method_first():
    from sweeps.digits_grid import GRID

    values = {"sigma": [0.02, 0.03], "method": ["mi_backprop", "hsic"], "lam": [0.0, 1.0],
              "K": [80], "seeds": [2, 0]}
    got = [(p["seed"], p["method"], p["lam"], p["sigma"]) for p in GRID.points(values)]
    # a cut-off grid holds whole seeds, the first method's ERM and lambda rows first
    assert got == [(2, "mi_backprop", 0.0, 0.02), (2, "mi_backprop", 1.0, 0.02),
                   (2, "mi_backprop", 0.0, 0.03), (2, "mi_backprop", 1.0, 0.03),
                   (2, "hsic", 1.0, 0.02), (2, "hsic", 1.0, 0.03),
                   (0, "mi_backprop", 0.0, 0.02), (0, "mi_backprop", 1.0, 0.02),
                   (0, "mi_backprop", 0.0, 0.03), (0, "mi_backprop", 1.0, 0.03),
                   (0, "hsic", 1.0, 0.02), (0, "hsic", 1.0, 0.03)]


ALL_SIGMAS = ["0.02", "0.025", "0.03", "0.035", "0.04", "0.045", "0.05"]


@pytest.mark.ray
@pytest.mark.parametrize("preset, lams, sigmas, seeds", [
    ("screen", {"mi_backprop": ["0.0", "0.3", "1.0", "3.0"], "confusion": ["0.3", "1.0", "3.0"],
                "lntl": ["0.001", "0.01", "0.1", "1.0"], "hsic": ["0.3", "1.0", "3.0"]},
     ["0.03"], ["0"]),
    ("table1", {"mi_backprop": ["0.0", "1.0"], "confusion": ["1.0"], "lntl": ["0.01"],
                "hsic": ["3.0"]}, ALL_SIGMAS, ["0", "1", "2"]),
    ("fig3", {"mi_backprop": ["0.0", "0.5", "1.0"]}, ["0.03", "0.045"], ["0", "1", "2"]),
])
def test_grid_presets_run_each_method_on_its_lambdas(preset, lams, sigmas, seeds, tmp_path):
    proc = _run("--preset", preset, "--dry-run", "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    trials = [line.split() for line in proc.stdout.strip().splitlines()[2:-1]]
    got: dict[str, list[str]] = {}
    for method, _sigma, lam, *_ in trials:
        got.setdefault(method, [])
        if lam not in got[method]:
            got[method].append(lam)
    assert got == lams
    # every (method, lambda) once per sigma and seed; ERM once per (sigma, seed)
    cells = {(t[0], t[1], t[2], t[-1]) for t in trials}
    assert len(cells) == len(trials) == sum(map(len, lams.values())) * len(sigmas) * len(seeds)
    assert sorted({t[1] for t in trials}, key=float) == sigmas
    assert sorted({t[-1] for t in trials}) == seeds


@pytest.mark.ray
@pytest.mark.parametrize("args, needle", [
    (["--lam-of", "lntl"], "expected METHOD=LAM"),
    (["--lam-of", "lntl=0.1"], "lntl is not in this sweep's --method (mi_backprop)"),
    (["--method", "lntl", "--lam-of", "lntl=-1"], "--lam-of"),
    (["--method", "lntl", "--lam-of", "ntl=1"], "unknown method"),
])
def test_bad_lam_of_is_one_error_line(args, needle, tmp_path):
    proc = _run(*args, "--out", str(tmp_path / "out"), "--dry-run")
    assert proc.returncode == 2 and needle in proc.stderr.strip().splitlines()[-1]


@pytest.mark.ray
def test_help_explains_presets():
    proc = _run("--help")
    assert proc.returncode == 0
    assert "quick" in proc.stdout and "paper" in proc.stdout and "--storage-path" in proc.stdout


@pytest.mark.ray
def test_tiny_sweep_writes_the_results_contract(ray_local, tmp_path):
    from sweeps.digits_grid import main

    out = tmp_path / "digits"
    rc = main(["--sigma", "0.03", "--lam", "0,1", "--seeds", "0", "--epochs", "2", "--K", "2",
               "--batch-size", "256", "--mi-eval-steps", "30", "--device", "cpu",
               "--palette", "kim", "--stroke", "flat", *SMALL_NET, *ONE_AT_A_TIME,
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
    record = json.loads((out / "experiment.json").read_text())
    assert record["experiment"] == "digits_grid"
    assert json.loads(df["config"].iloc[0])["stroke"] == "flat"
    # the data's bias strength, recomputed here from the same digits and settings
    from unbiased.benchmarks.digits.data import bias_strength, load_mnist5k

    (bias,) = record["bias_strength"]
    expected = bias_strength(load_mnist5k(), 0.03, 0, "kim", "flat")
    assert bias == {"sigma": 0.03, "seed": 0, "palette": "kim", "stroke": "flat",
                    "colour_only_acc": pytest.approx(expected, abs=1e-4)}
    table = (out / "table.md").read_text()
    assert "### Bias strength" in table and f"| kim, flat | {expected:.3f} |" in table


@pytest.mark.ray
def test_unreachable_address_fails_fast_with_one_line(tmp_path):
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # As a process: in this one a Ray started by an earlier test would be joined instead.
    proc = subprocess.run([sys.executable, str(DRIVER), "--address", f"127.0.0.1:{port}",
                           "--shared-storage", "--out", str(tmp_path / "out")],
                          capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 2
    assert "cannot connect to Ray at --address" in proc.stderr.strip().splitlines()[-1]
    assert "Traceback" not in proc.stderr and not (tmp_path / "out").exists()


@pytest.mark.parametrize("driver", ["digits", "german", "imdb"])
def test_every_method_setting_has_a_flag_that_reaches_the_trial_config(driver):
    """The trial config is derived from the methods' config dataclasses: each field has a
    flag on every driver, and a value set by it is in the trials' config."""
    from dataclasses import fields

    from sweeps.cli import build_parser, resolve
    from sweeps.core import benchmark_grid
    from unbiased.methods import METHODS
    from unbiased.methods.mi_backprop import INNER_Z_MODES

    spec = benchmark_grid(driver)
    parser = build_parser(spec.prog, "d", spec.bench.presets, benchmark=spec.bench)
    flags = {a.dest: a for a in parser._actions}
    for cls in METHODS.values():
        for f in fields(cls.Config):
            assert f.name in flags, (driver, cls.name, f.name)
    assert tuple(flags["inner_z"].choices) == INNER_Z_MODES
    argv = ["--preset", "quick", "--method", "mi_backprop,grad_reversal,confusion,hsic",
            "--theta-update", "joint", "--mine-ema-rate", "0", "--mine-hidden", "32",
            "--mine-hidden-layers", "3", "--no-rescale-mi-grad", "--select-epoch", "last",
            "--channels-last", "--amp", "--compile", "--bank-size", "8", "--head-hidden",
            "16", "--head-lr", "0.01", "--hsic-bandwidth", "2", "--eval-batch-size", "7",
            "--mine-standardize", "--mi-guard", "--inner-z", "first_k"]
    if spec.bench.name == "digits":
        argv += ["--z-relu", "--width", "16", "--palette", "distinct"]
    args = resolve(parser, spec.bench.name, spec.bench.presets, argv)
    spec.check_keys(args.values)
    fixed = spec.fixed_values(args.values)
    expected = {"theta_update": "joint", "mine_ema_rate": None, "mine_hidden": 32,
                "mine_hidden_layers": 3, "rescale_mi_grad": False, "select_epoch": "last",
                "channels_last": True, "amp": True, "compile": True, "bank_size": 8,
                "head_hidden": 16, "head_lr": 0.01, "hsic_bandwidth": 2.0,
                "eval_batch_size": 7, "mine_standardize": True, "mi_guard": True,
                "inner_z": "first_k"}
    if spec.bench.name == "digits":
        expected.update({"z_relu": True, "width": 16, "palette": "distinct"})
    for key, value in expected.items():
        assert fixed[key] == value, (driver, key)
    # one grid point per (data, method, lam, K, seed); K only for mi_backprop, and lam = 0
    # once (the first method's) as it is plain ERM for each
    points = spec.validate(args.values)
    lams, Ks = args.values["lam"], args.values["K"]
    data = 1
    for key in spec.data_axes:
        data *= len(args.values[key])
    seeds = len(args.values["seeds"])
    n_pos = sum(1 for lam in lams if lam > 0)
    n_zero = len(lams) - n_pos
    mi_points = len(Ks) * len(lams)
    assert len(points) == data * seeds * (mi_points + 3 * n_pos)
    assert all(("K" in p) == (p["method"] == "mi_backprop") for p in points)
    assert sum(p["lam"] == 0 for p in points) == data * seeds * n_zero * len(Ks)
