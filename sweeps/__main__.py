"""`python -m sweeps NAME [flags]`: one entry point for every driver.

A registered benchmark runs its grid; the other drivers have a file of their own (DRIVERS).
"""

from __future__ import annotations

import importlib
import sys

from unbiased.benchmarks import registered

DRIVERS = {
    "lambda_search": "sweeps.lambda_search",  # Optuna on digits: a search, not a grid
    "rerun": "sweeps.rerun",  # re-runs a finished sweep's picks on new seeds
    "export": "sweeps.export_epochs",  # a sweep's epochs as the CSV --done reads
    "piece": "sweeps.piece",  # the next whole trials of a grid in a time budget
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    benchmarks = registered()
    names = ", ".join(dict.fromkeys([*benchmarks, *DRIVERS]))
    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage: python -m sweeps BENCHMARK [flags]; BENCHMARK is one of {names}; "
              f"`python -m sweeps BENCHMARK --help` lists the flags")
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name in DRIVERS:
        return int(importlib.import_module(DRIVERS[name]).main(rest) or 0)
    if name not in benchmarks:
        print(f"error: unknown benchmark {name!r}; choose one of {names}", file=sys.stderr)
        return 2
    from sweeps.core import benchmark_grid, run_grid

    return int(run_grid(benchmark_grid(name), rest) or 0)


if __name__ == "__main__":
    from sweeps.ending import end_driver  # leaves Ray, then ends the process

    end_driver(main)
