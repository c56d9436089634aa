"""Which estimate should the label-free stopping rule minimise? (docs/MEASURED.md, "Table 1 on
full MNIST, `cpu` preset at 13 epochs")

Reads the per-epoch rows of digits sweeps (results.parquet, or a CSV with the same columns)
and, for every trial with lam > 0, the epoch each criterion picks among the epochs within 0.05
of the trial's best train accuracy (the rule's own eligibility), the test accuracy there, the
best and last epochs' test accuracy, and the Spearman correlation over the eligible epochs
between each criterion and test accuracy (negative: a lower estimate goes with a better model).
Uses test labels only to judge the criteria, never to pick.

    python bench/stopping_criteria.py results/digits_cpu/results.parquet more.csv ...
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

CRITERIA = ("mi_eval", "mi_eval_cond")
TOLERANCE = 0.05


def read(path: Path) -> pd.DataFrame:
    return pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="+", type=Path)
    args = p.parse_args(argv)
    df = pd.concat([read(f) for f in args.files], ignore_index=True)
    df = df[(df["lam"] > 0) & df["mi_eval"].notna()]
    rows = []
    for (sigma, lam, seed), trial in df.groupby(["sigma", "lam", "seed"]):
        trial = trial.sort_values("epoch").drop_duplicates("epoch", keep="last")
        fits = trial[trial["train_acc"] >= trial["train_acc"].max() - TOLERANCE]
        row = {"sigma": sigma, "lam": lam, "seed": seed, "epochs": len(trial),
               "best": trial["test_acc"].max(),
               "best_epoch": int(trial.loc[trial["test_acc"].idxmax(), "epoch"]),
               "last": trial["test_acc"].iloc[-1]}
        for crit in CRITERIA:
            pick = fits.loc[fits[crit][::-1].idxmin()]  # ties: the later epoch
            row[f"{crit}_pick"] = f"{pick['test_acc']:.3f}@{int(pick['epoch'])}"
            row[f"{crit}_acc"] = pick["test_acc"]
            row[f"{crit}_rho"] = fits[crit].corr(fits["test_acc"], method="spearman")
        rows.append(row)
    out = pd.DataFrame(rows)
    cols = ["sigma", "lam", "seed", "epochs", "best", "best_epoch", "last",
            *[f"{c}_{k}" for c in CRITERIA for k in ("pick", "rho")]]
    print(out[cols].to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print("\nmean test accuracy at the pick: " + ", ".join(
        f"{c} {out[f'{c}_acc'].mean():.3f}" for c in CRITERIA)
        + f"; best {out['best'].mean():.3f}, last {out['last'].mean():.3f}; mean Spearman: "
        + ", ".join(f"{c} {out[f'{c}_rho'].mean():.2f}" for c in CRITERIA))
    return 0


if __name__ == "__main__":
    sys.exit(main())
