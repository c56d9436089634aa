"""Whether two sweeps' results.parquet hold the same numbers: the check "refactors keep
numbers" runs on the commit before and after, one machine, the same flags.

    python bench/same_results.py BEFORE/results.parquet AFTER/results.parquet

Prints whether the columns (names, order, dtypes) agree and every column that differs in any
row, the ids and timings aside; then the last epoch of each lam > 0 trial. Exit status 1 when
anything differs.
"""

from __future__ import annotations

import sys

import pandas as pd

# Differ from run to run by design: where and how fast, and Tune's or the record's ids.
NOT_COMPARED = {"time_s", "epoch_s", "eval_s", "mi_eval_s", "ckpt_s", "trial_id", "node_id"}
KEYS = ("arm", "draw", "method", "sigma", "rho", "lam", "K", "seed", "epoch")


def differences(a: pd.DataFrame, b: pd.DataFrame) -> list[str]:
    out = []
    if list(a.columns) != list(b.columns):
        out.append(f"columns: {list(a.columns)} != {list(b.columns)}")
    out += [f"dtype of {c}: {a[c].dtype} != {b[c].dtype}" for c in a.columns
            if c in b.columns and a[c].dtype != b[c].dtype]
    if len(a) != len(b):
        return [*out, f"rows: {len(a)} != {len(b)}"]
    keys = [k for k in KEYS if k in a.columns]
    a = a.sort_values(keys).reset_index(drop=True).astype(object)
    b = b.sort_values(keys).reset_index(drop=True).astype(object)
    for column in a.columns:
        if column in NOT_COMPARED or column not in b.columns:
            continue
        same = (a[column] == b[column]) | (a[column].isna() & b[column].isna())
        if not same.all():
            i = int((~same).idxmax())
            out.append(f"{column}: {(~same).sum()} rows, first {a[column][i]!r} != "
                       f"{b[column][i]!r}")
    return out


def main() -> int:
    a, b = (pd.read_parquet(path) for path in sys.argv[1:3])
    found = differences(a, b)
    print("\n".join(found) if found else f"the same: {len(a)} rows, {len(a.columns)} columns "
          f"(not compared: {', '.join(sorted(NOT_COMPARED & set(a.columns)))})")
    keys = [k for k in KEYS if k in a.columns]
    last = b[b["lam"] > 0].sort_values(keys).groupby(keys[:-1], dropna=False).tail(1)
    print(last[[*keys, "train_acc", "test_acc", "mi_eval", "mi_eval_cond"]].to_string(
        index=False))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
