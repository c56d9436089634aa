"""Optuna lambda search (a tiny real run), the Pareto front, the ASHA option and the K-ablation
presets."""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
import pytest

from analysis.pareto import pareto_front, pareto_mask
from sweeps.cli import build_parser, resolve
from sweeps.lambda_search import LAMBDA_SEARCH
from tests.conftest import ONE_AT_A_TIME, SMALL_NET
from unbiased.benchmarks.digits.spec import DIGITS


def test_pareto_mask_keeps_only_non_dominated_rows():
    frame = pd.DataFrame({"mi_eval": [0.1, 0.2, 0.05, 0.3, 0.1, math.nan],
                          "train_acc": [0.9, 0.95, 0.8, 0.9, 0.85, 0.99]})
    # row 3 is worse than row 0 on both; row 4 ties row 0 on MI but fits less; NaN never.
    assert pareto_mask(frame).tolist() == [True, True, True, False, False, False]


def _finals(rows: list[tuple[float, int, float, float, float]]) -> pd.DataFrame:
    return pd.DataFrame([{"benchmark": "digits", "sigma": 0.03, "seed": 0, "trial_id": f"t{i}",
                          "method": "mi_backprop", "lam": lam, "K": K, "mi_eval": mi,
                          "mi": mi, "train_acc": acc, "test_acc": test, "status": "ok",
                          "loss_task": 0.1}
                         for i, (lam, K, mi, acc, test) in enumerate(rows)])


def test_lowest_mi_rule_on_the_front():
    finals = _finals([(0.01, 20, 0.30, 0.99, 0.50), (0.3, 40, 0.10, 0.97, 0.70),
                      (3.0, 80, 0.02, 0.60, 0.30), (1.0, 20, 0.20, 0.96, 0.60)])
    front = pareto_front(finals)
    assert sorted(front["lam"]) == [0.01, 0.3, 3.0]  # lam 1 is dominated by lam 0.3
    chosen = front[front["chosen"]]
    # lam 3 has the lowest MI but does not fit (0.60 vs best 0.99): lam 0.3 is chosen.
    assert chosen["lam"].tolist() == [0.3] and chosen["K"].tolist() == [40]
    assert "lowest" in chosen["reason"].iloc[0]


def test_asha_is_accepted_and_ranks_on_train_acc(capsys):
    from ray.tune.schedulers import ASHAScheduler

    from sweeps.runner import make_scheduler

    parser = build_parser("digits_grid.py", "x", DIGITS)
    args = resolve(parser, "digits", DIGITS, ["--scheduler", "asha", "--epochs", "8"])
    scheduler = make_scheduler(args)
    assert isinstance(scheduler, ASHAScheduler)
    assert scheduler.metric == "train_acc" and scheduler._mode == "max"  # no public mode
    fifo = make_scheduler(resolve(parser, "digits", DIGITS, []))  # by default
    assert fifo is None  # Tune's FIFO: trials start in the order the grid lists them
    with pytest.raises(SystemExit) as exc:
        resolve(parser, "digits", DIGITS, ["--scheduler", "hyperband"])
    assert exc.value.code == 2 and "--scheduler" in capsys.readouterr().err.splitlines()[-1]


def test_a_trial_the_scheduler_stopped_is_not_a_failure():
    from sweeps.results_frame import STOPPED_EARLY, all_ok, results_frame

    def result(tid: str, epochs_run: int) -> tuple:
        metrics = pd.DataFrame({"epoch": range(1, epochs_run + 1), "train_acc": 0.5,
                                "mi": 0.1, "node_id": "n1"})
        config = {"lam": 1.0, "K": 2, "seed": 0, "sigma": 0.03, "epochs": 4}
        return metrics, config, tid, None
    df = results_frame([result("a", 4), result("b", 1)], "digits_grid", "digits",
                       {"sigma": "sigma", "lam": "lam", "K": "K", "seed": "seed",
                        "epochs": "epochs"})
    status = df.groupby("trial_id")["status"].first()
    assert status["a"] == "ok" and status["b"] == STOPPED_EARLY and all_ok(df)
    assert df["node_id"].dtype == "string"


def test_search_flags_and_k_ablation_presets(capsys):
    parser = build_parser("lambda_search.py", "x", LAMBDA_SEARCH, search=True)
    args = resolve(parser, "digits", LAMBDA_SEARCH, ["--lam-range", "0.1,3"],
                   name="lambda_search")
    assert args["lam_range"] == [0.1, 3.0] and str(args.out).endswith("lambda_search_quick")
    with pytest.raises(SystemExit) as exc:
        resolve(parser, "digits", LAMBDA_SEARCH, ["--lam-range", "3,0.1"])
    assert exc.value.code == 2 and "--lam-range" in capsys.readouterr().err.splitlines()[-1]
    ablation = {name: v for name, v in DIGITS.items() if v.get("experiment") == "k_ablation"}
    assert sorted(ablation) == ["k_ablation_cpu", "k_ablation_paper", "k_ablation_quick"]
    for preset in ablation.values():
        assert preset["K"] == [20, 40, 80] and preset["lam"] == [1.0]
    paper = ablation["k_ablation_paper"]
    assert len(paper["sigma"]) * 3 * len(paper["seeds"]) == 63


@pytest.mark.ray
def test_tiny_search_writes_results_and_pareto_and_resumes(ray_local, tmp_path, capsys):
    from sweeps.lambda_search import main

    out = tmp_path / "search"
    args = ["--sigma", "0.03", "--K", "2,3", "--lam-range", "0.1,10", "--epochs", "1",
            "--batch-size", "256", "--mi-eval-steps", "30", "--device", "cpu", *SMALL_NET,
            *ONE_AT_A_TIME, "--out", str(out)]
    rc = main([*args, "--samples", "2"])
    assert rc == 0
    df = pd.read_parquet(out / "results.parquet")
    assert df["trial_id"].nunique() == 2 and (df["experiment"] == "lambda_search").all()
    assert df["lam"].between(0.1, 10).all() and set(df["K"]) <= {2, 3}
    assert df["mi_eval"].notna().all()
    front = pd.read_parquet(out / "pareto.parquet")
    assert 1 <= len(front) <= 2 and front["chosen"].sum() == 1
    assert np.isin(front["trial_id"], df["trial_id"]).all()
    assert "Chosen:" in (out / "pareto.md").read_text()
    assert (out / "table.md").exists()

    # Resumed with a larger budget: the study goes on from its finished trials' records
    # (their objectives are its first trials), which are not run again.
    capsys.readouterr()
    assert main([*args, "--samples", "3", "--resume"]) == 0
    printed = capsys.readouterr().out
    assert "resume: study lambda_search_sigma0.03_seed0: 2 of 3 trials finished" in printed
    assert len(re.findall(r"finished \d/3: ", printed)) == 1, printed
    again = pd.read_parquet(out / "results.parquet")
    assert again["trial_id"].nunique() == 3 and set(df["trial_id"]) < set(again["trial_id"])


@pytest.mark.ray
@pytest.mark.parametrize("driver", ["digits_grid", "german", "lambda_search"])
def test_every_driver_shares_the_argument_surface(driver, capsys):
    from sweeps.__main__ import main

    with pytest.raises(SystemExit) as exc:
        if driver == "digits_grid":  # python sweeps/digits_grid.py
            from sweeps.digits_grid import main as digits_grid

            digits_grid(["--help"])
        main([driver, "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for flag in ("--preset", "--K", "--seeds", "--epochs", "--scheduler", "--address",
                 "--storage-path", "--out", "--resume", "  quick:", "  paper:"):
        assert flag in text, flag


def test_a_dry_run_lists_the_studies_and_starts_nothing(tmp_path, capsys):
    from sweeps.lambda_search import main

    out = tmp_path / "search"
    assert main(["--sigma", "0.02,0.03", "--samples", "4", "--dry-run", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "2 studies x 4 trials" in printed and "(dry run: nothing started)" in printed
    assert "study: method mi_backprop, sigma 0.02, seed 0" in printed
    assert not out.exists()
