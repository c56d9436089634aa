"""K ablation on Colored MNIST (the supplementary's): K in {20, 40, 80} x sigma x seed at lam = 1.

    python sweeps/k_ablation.py                       # quick preset: 3 trials, embedded data, CPU
    python sweeps/k_ablation.py --preset paper --root data --address auto

The digits grid with its own presets (sweeps/presets.py: K_ABLATION) and experiment name, so
every flag of digits_grid.py works here. Writes OUT/results.parquet, OUT/table.md (one Table 1
block per K), OUT/figures/digits_K_ablation.png (final test accuracy and MI vs K) and the
per-K curves; default OUT is results/k_ablation_<preset>.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sweeps import digits_grid  # noqa: E402
from sweeps.core import run_grid  # noqa: E402
from sweeps.presets import K_ABLATION  # noqa: E402

EXPERIMENT = "k_ablation"


GRID = digits_grid.spec("k_ablation.py", __doc__.splitlines()[0], K_ABLATION, EXPERIMENT)


def main(argv: list[str] | None = None) -> int:
    return run_grid(GRID, argv)


if __name__ == "__main__":
    from sweeps.ending import end_driver  # leaves Ray, then ends the process

    end_driver(main)
