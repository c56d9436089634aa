"""Critic ablation on Colored MNIST: the four critics of mi_backprop x sigma x seed at lam = 1.

    python sweeps/critic_ablation.py                  # quick preset: 4 trials, embedded data, CPU
    python sweeps/critic_ablation.py --preset cpu --root ../shared/data/mnist

The critics are the paper's (`--no-mine-standardize --no-mi-guard`), standardised input only,
the MI guard only, and both (every digits preset's): `mine_standardize` and `mi_guard` are grid
axes here (a flag fixes one of them). The digits grid otherwise, with its own presets
(sweeps/presets.py: CRITIC_ABLATION) and experiment name. Writes OUT/results.parquet,
OUT/table.md (one block per critic) and figures; default OUT is results/critic_ablation_<preset>.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sweeps import digits_grid  # noqa: E402
from sweeps.core import run_grid  # noqa: E402
from sweeps.presets import CRITIC_ABLATION  # noqa: E402

EXPERIMENT = "critic_ablation"
CRITIC_AXES = ("mine_standardize", "mi_guard")

GRID = digits_grid.spec("critic_ablation.py", __doc__.splitlines()[0], CRITIC_ABLATION,
                        EXPERIMENT, data_axes=("sigma", *CRITIC_AXES))


def main(argv: list[str] | None = None) -> int:
    return run_grid(GRID, argv)


if __name__ == "__main__":
    from sweeps.ending import end_driver  # leaves Ray, then ends the process

    end_driver(main)
