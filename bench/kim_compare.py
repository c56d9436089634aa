"""`--preset kim` against the rows of the standalone driver it replaced
(bench/results/kim_protocol/epochs.csv, H200, seed 0): test accuracy of the baseline and of
the LNTL fine-tune at the epochs the old rows have (41: where its flat-curve stop ended the
fine-tune; 91: the checkpoint Kim's test.sh evaluates), per sigma and seed, side by side.

    python bench/kim_compare.py OUT [--epochs 1,41,91,100]

OUT: a `python -m sweeps digits --preset kim ...` output directory (its results.parquet).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
OLD = ROOT / "bench" / "results" / "kim_protocol" / "epochs.csv"


def compare(out: Path, epochs: list[int]) -> pd.DataFrame:
    ours = pd.read_parquet(out / "results.parquet")
    ours = ours[ours["method"] == "lntl"].assign(
        phase=lambda d: d["lam"].map(lambda lam: "baseline" if lam == 0 else "lntl"))
    old = pd.read_csv(OLD)
    rows = []
    for (sigma, seed, phase), own in ours.groupby(["sigma", "seed", "phase"]):
        then = old[(old["sigma"].sub(sigma).abs() < 1e-9) & (old["seed"] == seed)
                   & (old["phase"] == phase)].set_index("epoch")["test_acc"]
        now = own.set_index("epoch")["test_acc"]
        for epoch in epochs:
            rows.append({"sigma": sigma, "seed": int(seed), "phase": phase, "epoch": epoch,
                         "preset": now.get(epoch), "standalone": then.get(epoch)})
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--epochs", default="1,41,91,100")
    args = parser.parse_args(argv)
    if not (args.out / "results.parquet").is_file():
        print(f"error: {args.out / 'results.parquet'} not found: pass a sweep's OUT",
              file=sys.stderr)
        return 2
    try:
        epochs = [int(e) for e in args.epochs.split(",")]
    except ValueError:
        print(f"error: --epochs {args.epochs!r}: comma-separated integers", file=sys.stderr)
        return 2
    table = compare(args.out, epochs)
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4f}", na_rep="-"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
