"""`--warm-start`: a lam > 0 trial starts from the last checkpoint of the lam = 0 trial of its
grid point and seed (Kim et al. fine-tune LNTL from a trained baseline). The trial loop with
a recording session; the grid's sources, --done and bad input without Ray; one tiny sweep on
the session's Ray, where the warm trial must wait for its baseline to finish."""

from __future__ import annotations

import pandas as pd
import pytest

from tests.conftest import SMALL_NET
from tests.drivers import run_main
from unbiased.benchmarks.digits.spec import build as build_digits
from unbiased.settings import WARM_FROM
from unbiased.trial import MemorySession, WarmStartError, run_trial

# A warm trial at an lr too small to move g and f: its first epoch's train_acc is then the
# baseline's last, and a fresh start's (an untrained LeNet) would be far from it.
STILL = 1e-12


def _config(**over) -> dict:
    config = {"method": "lntl", "sigma": 0.03, "lam": 0.0, "seed": 0, "epochs": 2,
              "batch_size": 64, "lr": STILL, "baseline_lr": 1e-3, "device": "cpu",
              "width": 8, "num_threads": 1, "mi_eval_steps": 20}
    config.update(over)
    return config


@pytest.fixture
def build(tiny_digits):
    return lambda config: build_digits(config, digits=tiny_digits)


def test_a_warm_trial_starts_from_its_baselines_last_checkpoint(build):
    baseline = MemorySession()
    run_trial(_config(), build, baseline)
    trained = baseline.reports[-1]["train_acc"]
    assert trained > 0.3  # two epochs at lr 1e-3 learnt something

    warm = MemorySession(others={"lam=0.0": baseline.checkpoint})
    run_trial(_config(lam=0.01, **{WARM_FROM: "lam=0.0"}), build, warm)
    first = warm.reports[0]
    assert first["epoch"] == 1 and first["start_epoch"] == 1  # a trial of its own
    assert first["train_acc"] == pytest.approx(trained, abs=1e-9)

    cold = MemorySession()
    run_trial(_config(lam=0.01), build, cold)
    assert abs(cold.reports[0]["train_acc"] - trained) > 0.1


def test_a_baseline_without_a_checkpoint_is_a_clear_error(build):
    session = MemorySession(others={})
    with pytest.raises(WarmStartError, match="trial lam=0.0 .* left no checkpoint"):
        run_trial(_config(lam=0.01, **{WARM_FROM: "lam=0.0"}), build, session)
    assert session.reports == []


def test_the_baselines_a_warm_trial_starts_from_run_in_a_launch_before_it():
    from sweeps.core import warm_parts

    base = {"sigma": 0.03, "method": "lntl", "lam": 0.0, "seed": 0}
    warm = {**base, "lam": 0.01, WARM_FROM: "sigma=0.03_method=lntl_lam=0.0_seed=0"}
    other = {**base, "sigma": 0.02, "lam": 0.01}  # starts from a baseline finished earlier
    assert warm_parts([base, warm, other]) == [[base], [warm, other]]
    assert warm_parts([other]) == [[other]]


KIM_TINY = ["--preset", "kim", "--sigma", "0.03,0.02", "--seeds", "0", "--dry-run"]


@pytest.mark.ray
def test_dry_run_says_which_trial_each_starts_from():
    ran = run_main("digits_grid", *KIM_TINY)
    assert ran.returncode == 0, ran.stderr
    table = [line.split() for line in ran.stdout.splitlines()
             if line.split()[:1] and line.split()[0].isdigit()]
    # trial, method, sigma, lam, seed, starts_from (the baseline's record)
    assert [(row[3], row[5]) for row in table] == [
        ("0.0", "-"), ("0.01", "sigma=0.03_method=lntl_lam=0.0_seed=0"),
        ("0.0", "-"), ("0.01", "sigma=0.02_method=lntl_lam=0.0_seed=0")]


@pytest.mark.ray
def test_done_runs_again_a_baseline_a_trial_still_to_run_starts_from(tmp_path):
    done = tmp_path / "done.csv"
    rows = [{"method": "lntl", "sigma": 0.03, "lam": 0.0, "seed": 0, "epoch": e,
             "test_acc": 0.5} for e in range(1, 4)]
    pd.DataFrame(rows).to_csv(done, index=False)
    ran = run_main("digits_grid", *KIM_TINY, "--epochs", "3", "--done", str(done))
    assert ran.returncode == 0, ran.stderr
    assert "1 of 4 trials finished" in ran.stdout
    assert "--warm-start: 1 of them run again" in ran.stdout
    assert "4 trials" in ran.stdout.splitlines()[0]

    finished = rows + [{**r, "lam": 0.01} for r in rows]
    pd.DataFrame(finished).to_csv(done, index=False)
    ran = run_main("digits_grid", *KIM_TINY, "--epochs", "3", "--done", str(done))
    assert "2 of 4 trials finished" in ran.stdout and "--warm-start:" not in ran.stdout
    assert "2 trials" in ran.stdout.splitlines()[0]


@pytest.mark.ray
@pytest.mark.parametrize("args, says", [
    (["--lam", "0.01"], "which this sweep does not run: add 0 to --lam"),
    (["--bundle", "2"], "--warm-start runs each trial on its own: drop --bundle"),
])
def test_a_warm_start_that_cannot_be_is_one_error_line(args, says):
    ran = run_main("digits_grid", *KIM_TINY, *args)
    assert ran.returncode == 2
    assert ran.stderr.strip().splitlines()[-1].startswith("error:")
    assert says in ran.stderr


@pytest.mark.ray
def test_the_grid_starts_a_warm_trial_once_its_baseline_has_finished(ray_local, tmp_path):
    """Tune starts every pending trial that fits: in one launch the lam = 0.01 trial would
    start beside its baseline and fail (no checkpoint yet), or start from an early one. The
    baseline runs in a launch of its own first; the warm trial starts from its last
    checkpoint: its first epoch's train_acc is the baseline's last."""
    from sweeps.digits_grid import main

    out = tmp_path / "warm"
    rc = main(["--preset", "quick", "--sigma", "0.03", "--seeds", "0", "--epochs", "2",
               "--method", "lntl", "--lam", "0,0.01", "--lr", str(STILL), "--baseline-lr",
               "1e-3", "--warm-start", "--batch-size", "256", "--mi-eval-steps", "20",
               "--device", "cpu", *SMALL_NET, "--cpus-per-trial", "1",
               "--max-failures", "0", "--out", str(out)])  # no retry after a start too early
    assert rc == 0
    df = pd.read_parquet(out / "results.parquet")
    base = df[df["lam"] == 0].set_index("epoch")["train_acc"]
    warm = df[df["lam"] == 0.01].set_index("epoch")["train_acc"]
    assert base[2] != base[1]
    assert warm[1] == pytest.approx(base[2], abs=1e-9)
