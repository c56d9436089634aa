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

import pandas as pd  # noqa: E402

from sweeps.cli import COMMON_LOOP_KEYS, build_parser, resolve  # noqa: E402
from sweeps.presets import IMDB  # noqa: E402
from sweeps.runner import (  # noqa: E402
    SweepError,
    all_ok,
    check_out_dir,
    fail,
    init_ray,
    results_frame,
    run_tuner,
    write_outputs,
)

EXPERIMENT = "imdb_grid"
BENCHMARK = "imdb"
LOOP_KEYS = (*COMMON_LOOP_KEYS, "eval_batch_size", "arch", "image_size", "train_subset",
             "max_eval", "num_workers")


def param_space(values: dict, weights_path: str | None) -> dict:
    from ray import tune

    space = {key: values[key] for key in LOOP_KEYS if key in values}
    space.update({
        "train_split": tune.grid_search(list(values["train_split"])),
        "lam": tune.grid_search(list(values["lam"])),
        "K": tune.grid_search(list(values["K"])),
        "seed": tune.grid_search(list(values["seeds"])),
        "num_threads": max(1, int(float(values["cpus_per_trial"]))),
        "weights_path": weights_path or "",  # "" = random init
    })
    return space


def main(argv: list[str] | None = None) -> int:
    parser = build_parser("imdb_grid.py", __doc__.splitlines()[0], IMDB, uses_sigma=False,
                          imdb=True)
    args = resolve(parser, BENCHMARK, IMDB, argv)
    try:
        check_out_dir(args, EXPERIMENT)
        from unbiased.benchmarks import imdb
        from unbiased.data import DataError
        from unbiased.models import resolve_imagenet_weights

        # Everything that can fail on the user's side fails here, before Ray starts.
        try:
            index = imdb.load_index(args.values.get("root"))
            weights_path = resolve_imagenet_weights(str(args["arch"]),
                                                    str(args["weights"]))
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
        n_trials = (len(args["train_split"]) * len(args["lam"]) * len(args["K"])
                    * len(args["seeds"]))
        print(f"{EXPERIMENT}: preset {args.preset}, {n_trials} trials, {args['arch']} "
              f"(weights {weights_path or 'none'}), training subsets of "
              f"{subset or 'all'} images, {args['epochs']} epochs each -> {args.out}",
              flush=True)
        init_ray(args.address)
        from ray import tune

        from trainables.imdb import train_imdb

        resources = {"cpu": float(args["cpus_per_trial"]), "gpu": float(args["gpus_per_trial"])}
        grid = run_tuner(args, EXPERIMENT,
                         tune.with_parameters(train_imdb, index=index, splits=splits),
                         param_space(args.values, weights_path), resources,
                         param_keys=("train_split", "lam", "K", "seed"), n_trials=n_trials)
        df = results_frame(grid, EXPERIMENT, BENCHMARK,
                           {"lam": "lam", "K": "K", "seed": "seed", "epochs": "epochs",
                            "train_split": "train_split"})
        written = write_outputs(args, EXPERIMENT, df)
    except SweepError as exc:
        fail(str(exc))
    _summary(df)
    for path in written:
        print(f"wrote {path}")
    return 0 if all_ok(df) else 1


def _summary(df: pd.DataFrame) -> None:
    last = df.sort_values("epoch").groupby("trial_id").tail(1)
    cols = [c for c in ("train_split", "lam", "K", "seed", "epoch", "train_acc", "acc_eb1",
                        "acc_eb2", "acc_test", "mi", "mi_eval", "status") if c in last.columns]
    print(last[cols].sort_values(["train_split", "lam", "K", "seed"]).to_string(
        index=False, float_format=lambda v: f"{v:.3f}"))


if __name__ == "__main__":
    sys.exit(main())
