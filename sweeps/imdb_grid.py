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

from sweeps.cli import SweepArgs  # noqa: E402
from sweeps.common import SweepError  # noqa: E402
from sweeps.core import GridSpec, run_grid  # noqa: E402
from sweeps.presets import IMDB  # noqa: E402

EXPERIMENT = "imdb_grid"
BENCHMARK = "imdb"
# What trainables/imdb.py's build reads from a trial config.
BUILD_KEYS = ("root", "arch", "image_size", "train_subset", "max_eval", "num_workers",
              "weights_path")


def _load(args: SweepArgs) -> tuple[dict[str, object], str]:
    from unbiased.benchmarks import imdb
    from unbiased.data import DataError
    from unbiased.models import resolve_imagenet_weights

    # Everything that can fail on the user's side fails here, before Ray starts.
    try:
        index = imdb.load_index(args.values.get("root"))
        weights_path = resolve_imagenet_weights(str(args["arch"]), str(args["weights"]))
    except DataError as exc:
        raise SweepError(str(exc)) from None
    splits = imdb.build_splits(index)
    print(index.report.summary(), flush=True)
    print(imdb.describe_splits(splits), flush=True)
    subset = int(args["train_subset"] or 0)
    for name in args["train_split"]:
        if min(len(splits.rows[name]), subset or len(splits.rows[name])) < 2:
            raise SweepError(f"IMDB split {name} has {len(splits.rows[name])} usable "
                             f"images: too few to train")
    args.values["weights_path"] = weights_path or ""  # "" = random init
    return ({"index": index, "splits": splits},
            f"{args['arch']}, weights {weights_path or 'none'}, training subsets of "
            f"{subset or 'all'} images")


def _trainable():
    from trainables.imdb import train_imdb

    return train_imdb


SPEC = GridSpec(
    prog="imdb_grid.py", description=__doc__.splitlines()[0], experiment=EXPERIMENT,
    benchmark=BENCHMARK, presets=IMDB, build_keys=BUILD_KEYS,
    data_axes=("train_split",), load=_load, trainable=_trainable,
    parser_options={"uses_sigma": False, "imdb": True},
    summary_columns=("method", "train_split", "lam", "K", "seed", "epoch", "train_acc",
                     "acc_eb1", "acc_eb2", "acc_test", "mi", "mi_eval", "status"))


def main(argv: list[str] | None = None) -> int:
    return run_grid(SPEC, argv)


if __name__ == "__main__":
    sys.exit(main())
