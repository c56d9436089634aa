"""Colored MNIST grid (the paper's Table 1 and Fig. 3): sigma x method x lambda x K x seed.

    python sweeps/digits_grid.py                      # quick preset, embedded data, CPU
    python sweeps/digits_grid.py --method mi_backprop,grad_reversal,confusion,hsic
    python sweeps/digits_grid.py --preset paper --root data --address auto

Writes OUT/results.parquet (one row per trial and epoch), OUT/table.md, OUT/table.parquet and
OUT/figures/*.png.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sweeps.cli import SweepArgs  # noqa: E402
from sweeps.core import GridSpec, run_grid  # noqa: E402
from unbiased.benchmarks import benchmark_spec  # noqa: E402

EXPERIMENT = "digits_grid"
# Its presets, flags, data and build: unbiased/benchmarks/digits.py.
BENCH = benchmark_spec("digits")


def load_digits(args: SweepArgs):
    """The grey digits, read once in the driver (lambda_search.py shares them)."""
    return GRID.load(args)[0]["digits"]


def bias_strength(args: SweepArgs, digits) -> tuple[dict, list[str]]:
    """Per sigma and seed, the share of training digits the colour alone classifies."""
    return BENCH.describe(args.values, {"digits": digits})


# The ablations are presets of it (k_ablation_cpu, critic_ablation_cpu, ...).
GRID = GridSpec.from_benchmark(BENCH, prog="digits_grid.py",
                               description=__doc__.splitlines()[0])


def main(argv: list[str] | None = None) -> int:
    return run_grid(GRID, argv)


if __name__ == "__main__":
    from sweeps.ending import end_driver  # leaves Ray, then ends the process

    end_driver(main)
