"""Where the seconds of a trial's epoch go: a real digits sweep of two trials (lam 0 and 1, the
`cpu` preset, side by side as its grid runs them), and each epoch's parts as the trials
themselves measured them (unbiased/trial.py: time_s, eval_s, mi_eval_s, ckpt_s, epoch_s).

    python bench/epoch_cost.py --root ../shared/data/mnist       # full MNIST, 2 epochs
    python bench/epoch_cost.py                                   # the embedded 5k subset
    python bench/epoch_cost.py --root ../shared/data/mnist --epochs 3 --seed 7 \
        -- --inner-z fresh                                       # extra driver flags

Parts of one epoch: training steps (`time_s`), evaluation (`evaluate()`: train_acc, the
trial's own mi, test accuracy), mi_eval (the two fresh statistics networks, every epoch of a
lam > 0 trial under `--select-epoch lowest_mi`, the last epoch of lam 0), checkpoint (state
copy and torch.save) and other (the rest of `epoch_s`). `tune` is what Tune's own clock
(`time_this_iter_s`) adds beyond epoch_s: the report and checkpoint upload of the previous
epoch (epoch 1 also counts the trial's start, so it is shown for later epochs only).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd  # noqa: E402

PARTS = (("train steps", "time_s"), ("evaluation", "eval_s"), ("mi_eval", "mi_eval_s"),
         ("checkpoint", "ckpt_s"))


def tune_seconds(out: Path) -> dict[tuple[float, int], float]:
    """(lam, epoch) -> Tune's time_this_iter_s, read from each trial's result.json."""
    seconds = {}
    for path in (out / "tune").glob("*/*/result.json"):
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            row = json.loads(line)
            lam = float(row["config"]["point"]["lam"])
            seconds[(lam, int(row["epoch"]))] = float(row["time_this_iter_s"])
    return seconds


def breakdown(df: pd.DataFrame, tune_s: dict[tuple[float, int], float]) -> pd.DataFrame:
    rows = []
    for _, r in df.sort_values(["lam", "epoch"]).iterrows():
        row = {"lam": r["lam"], "epoch": int(r["epoch"])}
        for name, col in PARTS:
            row[name] = float(r[col])
        row["other"] = float(r["epoch_s"]) - sum(row[name] for name, _ in PARTS)
        row["epoch_s"] = float(r["epoch_s"])
        row["non-train share"] = 1 - row["train steps"] / row["epoch_s"]
        wall = tune_s.get((float(r["lam"]), row["epoch"]))
        row["tune"] = (wall - row["epoch_s"]) if wall is not None and row["epoch"] > 1 \
            else float("nan")
        rows.append(row)
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", help="full MNIST in torchvision's layout; without it the "
                                  "embedded 5,000-digit subset")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sigma", default="0.03")
    p.add_argument("--out", help="sweep directory (default: a temporary one)")
    p.add_argument("driver_args", nargs="*", help="more digits_grid.py flags, after --")
    args = p.parse_args(argv)

    from dataclasses import replace

    from sweeps import digits_grid
    from sweeps.core import run_grid
    from unbiased.benchmarks.digits.spec import DIGITS

    presets = DIGITS
    if args.root is None:
        presets = {**DIGITS, "cpu": {**DIGITS["cpu"], "source": "mnist5k"}}
    spec = replace(digits_grid.GRID, presets=presets)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.out or tmp)
        driver = ["--preset", "cpu", "--sigma", args.sigma, "--lam", "0,1", "--seeds",
                  str(args.seed), "--epochs", str(args.epochs), "--out", str(out),
                  "--overwrite", *(["--root", args.root] if args.root else []),
                  *args.driver_args]
        print("digits_grid.py " + " ".join(driver), flush=True)
        code = run_grid(spec, driver)
        if code != 0:
            print(f"error: the sweep failed (exit {code})", file=sys.stderr)
            return 1
        df = pd.read_parquet(out / "results.parquet")
        table = breakdown(df, tune_seconds(out))
    names = [name for name, _ in PARTS] + ["other", "tune"]
    print(f"\nseconds per epoch part ({'full MNIST' if args.root else 'embedded 5k'}, "
          f"sigma {args.sigma}, seed {args.seed}; share of epoch_s in brackets):")
    print(f"{'lam':>4}{'epoch':>6}" + "".join(f"{n:>20}" for n in names)
          + f"{'epoch_s':>9}{'non-train':>10}")
    for _, r in table.iterrows():
        cells = "".join(f"{r[n]:>11.1f} ({r[n] / r['epoch_s']:>5.1%})" for n in names)
        print(f"{r['lam']:>4g}{r['epoch']:>6}{cells}{r['epoch_s']:>9.1f}"
              f"{r['non-train share']:>10.1%}")
    mean = table.groupby("lam")[["epoch_s", "train steps"]].mean()
    if {0.0, 1.0} <= set(mean.index):
        ratio = mean.loc[1.0] / mean.loc[0.0]
        print(f"\nlam 1 epoch / lam 0 epoch: {ratio['epoch_s']:.2f} (training steps alone: "
              f"{ratio['train steps']:.2f})")
    worst = table.groupby("lam")["non-train share"].max()
    print("largest non-training share: " + ", ".join(f"lam {lam:g} {v:.1%}"
                                                     for lam, v in worst.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
