"""Small synthetic results frames in the contract's shape, for tests and demos."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

NAN = math.nan


def trial(*, benchmark: str = "digits", lam: float = 0.0, sigma: float = 0.03, K: int = 80,
          seed: int = 0, epochs: int = 3, mi: float = 0.5, train_acc: float = 0.99,
          test_acc: float = 0.5, mi_eval: float = NAN, method: str = "mi_backprop",
          status: str = "ok", trial_id: str | None = None, experiment: str = "synthetic",
          **final_extra: Any) -> list[dict[str, Any]]:
    """Rows of one trial whose final epoch holds exactly the given values (earlier epochs ramp
    towards them); `final_extra` (eo, train_split, loss_task, ...) is set on every row."""
    split = f"_{final_extra['train_split']}" if "train_split" in final_extra else ""
    tid = trial_id or f"{benchmark}{split}_s{sigma:g}_l{lam:g}_K{K}_seed{seed}_{method}"
    rows = []
    for epoch in range(1, epochs + 1):
        frac = epoch / epochs
        ramp = 0.5 + 0.5 * frac
        row: dict[str, Any] = {
            "experiment": experiment, "trial_id": tid, "benchmark": benchmark,
            "method": method, "sigma": sigma, "lam": lam, "K": K, "seed": seed,
            "epoch": epoch,
            "mi": mi if epoch == epochs else mi + (1 - frac),
            "train_acc": train_acc if epoch == epochs else train_acc * ramp,
            "test_acc": test_acc if epoch == epochs else test_acc * ramp,
            "time_s": 1.0 * epoch,
            "mi_eval": mi_eval if epoch == epochs else NAN,
            "epochs": epochs, "status": status,
        }
        for key, value in final_extra.items():
            numeric = isinstance(value, float) and key != "loss_task"
            row[key] = value if (epoch == epochs or not numeric) else value * ramp
        rows.append(row)
    return rows


def frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """A DataFrame with the contract's dtypes."""
    df = pd.DataFrame(rows)
    types = {"sigma": "float64", "lam": "float64", "K": "int64", "seed": "int64",
             "epoch": "int64", "mi": "float64", "train_acc": "float64", "test_acc": "float64",
             "time_s": "float64", "mi_eval": "float64"}
    return df.astype({k: v for k, v in types.items() if k in df.columns})


def demo() -> pd.DataFrame:
    """A small sweep over all three benchmarks: 2 sigmas x 3 lambdas x 2 K x 2 seeds of
    digits, German with an SVM baseline, IMDB on both splits, and one diverged trial."""
    rows: list[dict[str, Any]] = []
    for K in (20, 80):
        for sigma in (0.02, 0.03):
            for lam, mi, acc in ((0.0, 1.2, 0.5), (0.5, 0.6, 0.7), (1.0, 0.2, 0.85)):
                for seed in (0, 1):
                    rows += trial(lam=lam, sigma=sigma, K=K, seed=seed, epochs=4,
                                  mi=mi + 0.01 * seed, test_acc=acc + 0.01 * seed + sigma,
                                  train_acc=0.99 - 0.02 * lam, mi_eval=mi * 0.9,
                                  loss_task=0.05)
    rows += trial(lam=2.0, sigma=0.02, K=80, seed=0, epochs=4, mi=NAN, test_acc=0.1,
                  train_acc=0.1, status="diverged: loss is nan", loss_task=NAN)
    for lam, eo in ((0.0, 0.4), (0.5, 0.15), (1.0, 0.06)):
        for seed in range(3):
            rows += trial(benchmark="german", lam=lam, sigma=NAN, K=30, seed=seed, epochs=5,
                          mi=0.3 - 0.25 * lam, test_acc=0.74 - 0.01 * lam, train_acc=0.8,
                          eo=eo + 0.01 * seed)
    for seed in range(3):
        rows += trial(benchmark="german", method="svm", lam=NAN, sigma=NAN, K=0, seed=seed,
                      epochs=1, mi=NAN, test_acc=0.74, train_acc=0.78, eo=0.1,
                      trial_id=f"svm_seed{seed}")
    for split, other in (("EB1", "acc_eb2"), ("EB2", "acc_eb1")):
        for lam in (0.0, 0.5, 0.9):
            for seed in (0, 1):
                rows += trial(benchmark="imdb", lam=lam, sigma=NAN, K=40, seed=seed, epochs=3,
                              mi=0.8 - 0.5 * lam, test_acc=0.8 + 0.05 * lam, train_acc=0.97,
                              train_split=split, acc_test=0.8 + 0.05 * lam,
                              **{other: 0.6 + 0.05 * lam})
    return frame(rows)
