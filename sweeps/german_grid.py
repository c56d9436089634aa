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
from sweeps.cli import SweepArgs  # noqa: E402
from sweeps.core import GridSpec, run_grid  # noqa: E402
from unbiased.benchmarks import benchmark_spec  # noqa: E402

EXPERIMENT = "german_grid"
BENCHMARK = "german"
SVM_METHOD = "svm"


def _svm(args: SweepArgs, loaded: dict, like: pd.DataFrame) -> pd.DataFrame:
    from unbiased.benchmarks import german_credit

    table = loaded["table"]
    return svm_rows([svm_baseline(german_credit.build(seed, table=table), seed)
                     for seed in args["seeds"]], like)


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


# The registered benchmark (unbiased/benchmarks/german.py) plus the SVM rows.
GRID = GridSpec.from_benchmark(benchmark_spec(BENCHMARK), prog="german_grid.py",
                               description=__doc__.splitlines()[0], extra_rows=_svm)


def main(argv: list[str] | None = None) -> int:
    return run_grid(GRID, argv)


if __name__ == "__main__":
    from sweeps.ending import end_driver  # leaves Ray, then ends the process

    end_driver(main)
