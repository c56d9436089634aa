"""Colored MNIST grid (the paper's Table 1 and Fig. 3): sigma x method x lambda x K x seed.

`python -m sweeps digits` under the name docs/CLUSTER.md's commands use; its presets, flags
and data: unbiased/benchmarks/digits/spec.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run by path, this file imports the package of its own checkout, not the copy the Python's
# environment installed (another worktree's .venv, or an Apptainer image's copy).
if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sweeps.core import benchmark_grid, run_grid  # noqa: E402

GRID = benchmark_grid("digits", own_prog="digits_grid.py")


def main(argv: list[str] | None = None) -> int:
    return run_grid(GRID, argv)


if __name__ == "__main__":
    from sweeps.ending import end_driver  # leaves Ray, then ends the process

    end_driver(main)
