"""IMDB faces grid (the paper's Table 2): train split {EB1, EB2} x lambda x K x seed.

    python sweeps/imdb_grid.py --root data/imdb_crop                    # quick preset, CPU
    python sweeps/imdb_grid.py --preset paper --root data/imdb_crop     # one GPU per trial
    python sweeps/imdb_grid.py --preset paper --root /shared/imdb_crop --address auto

--root is the IMDB-WIKI imdb_crop release (imdb.mat + JPEG folders), or its parent. The
driver reads and cleans imdb.mat once, checks the files, prints the split sizes next to the
paper's, resolves the backbone weights once (offline: --weights PATH), and ships the index to
the trials. Writes OUT/results.parquet (one row per trial and epoch, with train_split,
acc_eb1 / acc_eb2 and acc_test), OUT/table.md (Table 2), OUT/table.parquet and
OUT/figures/*.png.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sweeps.core import GridSpec, run_grid  # noqa: E402
from unbiased.benchmarks import benchmark_spec  # noqa: E402

EXPERIMENT = "imdb_grid"
BENCHMARK = "imdb"

# Everything is the registered benchmark's (unbiased/benchmarks/imdb.py).
GRID = GridSpec.from_benchmark(benchmark_spec(BENCHMARK), prog="imdb_grid.py",
                               description=__doc__.splitlines()[0])


def main(argv: list[str] | None = None) -> int:
    return run_grid(GRID, argv)


if __name__ == "__main__":
    from sweeps.ending import end_driver  # leaves Ray, then ends the process

    end_driver(main)
