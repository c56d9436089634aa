"""German credit grid (the paper's Table 3 and its lambda bar plots): lambda x K x seed.

    python sweeps/german_grid.py                      # quick preset, shipped data, CPU
    python sweeps/german_grid.py --preset paper       # 5 lambdas x 10 seeds x 500 epochs

Each seed is its own random 70/30 split. Beside the Tune trials, an RBF SVM (C by 5-fold CV
on the training split) is fitted on every seed's split and written as `method = svm` rows.
Writes OUT/results.parquet (one row per trial and epoch, plus one per SVM seed), OUT/table.md,
OUT/table.parquet and OUT/figures/*.png.
"""

from __future__ import annotations

import math
import socket
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd  # noqa: E402

from sweeps.baselines import SvmResult, svm_baseline  # noqa: E402
from sweeps.cli import COMMON_LOOP_KEYS, build_parser, resolve  # noqa: E402
from sweeps.presets import GERMAN  # noqa: E402
from sweeps.runner import (  # noqa: E402
    SweepError,
    all_ok,
    check_out_dir,
    fail,
    init_ray,
    results_frame,
    run_tuner,
    write_outputs,
)

EXPERIMENT = "german_grid"
BENCHMARK = "german"
SVM_METHOD = "svm"
LOOP_KEYS = (*COMMON_LOOP_KEYS, "mine_hidden")


def param_space(values: dict) -> dict:
    from ray import tune

    space = {key: values[key] for key in LOOP_KEYS if key in values}
    space.update({
        "lam": tune.grid_search(list(values["lam"])),
        "K": tune.grid_search(list(values["K"])),
        "seed": tune.grid_search(list(values["seeds"])),
        "num_threads": max(1, int(float(values["cpus_per_trial"]))),
    })
    return space


def svm_rows(results: list[SvmResult], like: pd.DataFrame) -> pd.DataFrame:
    """The SVM results as rows of results.parquet: the same columns and dtypes as `like`,
    with the fields a non-MI method lacks set so the analysis can still group them (lam NaN,
    K 0, one 'epoch', mi and mi_eval NaN)."""
    node = socket.gethostname()
    rows = [{
        "experiment": EXPERIMENT, "trial_id": f"svm_seed{r.seed}", "benchmark": BENCHMARK,
        "method": SVM_METHOD, "sigma": math.nan, "lam": math.nan, "K": 0, "seed": r.seed,
        "epoch": 1, "mi": math.nan, "train_acc": r.train_acc, "test_acc": r.test_acc,
        "time_s": r.time_s, "mi_eval": math.nan, "loss_task": math.nan, "mi_batch": math.nan,
        "epochs": 1, "start_epoch": 1, "node": node, "status": "ok", "eo": r.eo,
        "svm_C": r.C,
    } for r in results]
    df = pd.DataFrame(rows)
    columns = list(like.columns) + [c for c in df.columns if c not in like.columns]
    df = df.reindex(columns=columns)
    return df.astype({c: like[c].dtype for c in like.columns if c in df.columns})


def main(argv: list[str] | None = None) -> int:
    parser = build_parser("german_grid.py", __doc__.splitlines()[0], GERMAN, uses_sigma=False)
    args = resolve(parser, BENCHMARK, GERMAN, argv)
    try:
        check_out_dir(args, EXPERIMENT)
        from unbiased.benchmarks import german
        from unbiased.data import DataError

        # Parse the file once here (a bad --root fails before Ray starts); trials get the
        # parsed table through the object store and build their own split from it.
        try:
            table = german.load_table(args.values.get("root"))
        except DataError as exc:
            raise SweepError(str(exc)) from None
        n_trials = len(args["lam"]) * len(args["K"]) * len(args["seeds"])
        print(f"german_grid: preset {args.preset}, {n_trials} trials ({len(table)} rows from "
              f"{table.source}), {args['epochs']} epochs each -> {args.out}", flush=True)
        svm = [svm_baseline(german.build(seed, table=table), seed) for seed in args["seeds"]]
        init_ray(args.address)
        from ray import tune

        from trainables.german import train_german

        resources = {"cpu": float(args["cpus_per_trial"]), "gpu": float(args["gpus_per_trial"])}
        grid = run_tuner(args, EXPERIMENT, tune.with_parameters(train_german, table=table),
                         param_space(args.values), resources)
        df = results_frame(grid, EXPERIMENT, BENCHMARK,
                           {"lam": "lam", "K": "K", "seed": "seed", "epochs": "epochs"})
        df = pd.concat([df, svm_rows(svm, df)], ignore_index=True)
        written = write_outputs(args, EXPERIMENT, df)
    except SweepError as exc:
        fail(str(exc))
    _summary(df)
    for path in written:
        print(f"wrote {path}")
    return 0 if all_ok(df) else 1


def _summary(df: pd.DataFrame) -> None:
    last = df.sort_values("epoch").groupby("trial_id").tail(1)
    cols = ["method", "lam", "K", "seed", "epoch", "train_acc", "test_acc", "eo", "mi",
            "mi_eval", "status"]
    print(last[cols].sort_values(["method", "lam", "K", "seed"]).to_string(
        index=False, float_format=lambda v: f"{v:.3f}"))
    means = last.groupby(["method", "lam"], dropna=False)[["test_acc", "eo", "mi_eval"]].mean()
    print("mean over seeds:")
    print(means.to_string(float_format=lambda v: f"{v:.3f}"))


if __name__ == "__main__":
    sys.exit(main())
