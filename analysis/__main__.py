"""python -m analysis DIR: rebuild DIR's tables and figures from DIR/results.parquet."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from analysis.build import build_all
from analysis.results import ResultsError
from analysis.selection import default_rules


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m analysis",
        description="Rebuild tables and figures of a results directory from results.parquet.")
    parser.add_argument("results_dir", type=Path, metavar="DIR",
                        help="directory holding results.parquet")
    parser.add_argument("--tolerance", type=float, default=0.05,
                        help="train-accuracy tolerance of the label-free rules (default 0.05)")
    parser.add_argument("--no-figures", action="store_true", help="write tables only")
    args = parser.parse_args(argv)
    if not (args.tolerance >= 0):
        parser.error(f"argument --tolerance: must be >= 0, got {args.tolerance}")
    try:
        written = build_all(args.results_dir, rules=default_rules(args.tolerance),
                            figures=not args.no_figures)
    except (ResultsError, OSError) as exc:
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"error: {message}", file=sys.stderr)
        return 2
    for path in written:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
