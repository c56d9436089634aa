"""Colored MNIST grid (the paper's Table 1 and Fig. 3): sigma x lambda x K x seed.

    python sweeps/digits_grid.py                      # quick preset, embedded data, CPU
    python sweeps/digits_grid.py --preset paper --root data --address auto

Writes OUT/results.parquet (one row per trial and epoch), OUT/table.md, OUT/table.parquet and
OUT/figures/*.png.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sweeps.cli import COMMON_LOOP_KEYS, SweepArgs, build_parser, resolve  # noqa: E402
from sweeps.presets import DIGITS  # noqa: E402
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
from unbiased.benchmarks.colored_mnist import GreyDigits  # noqa: E402

EXPERIMENT = "digits_grid"
LOOP_KEYS = (*COMMON_LOOP_KEYS, "source", "z_relu", "width", "palette")


def param_space(values: dict) -> dict:
    from ray import tune

    space = {key: values[key] for key in LOOP_KEYS if key in values}
    space.update({
        "sigma": tune.grid_search(list(values["sigma"])),
        "lam": tune.grid_search(list(values["lam"])),
        "K": tune.grid_search(list(values["K"])),
        "seed": tune.grid_search(list(values["seeds"])),
        "num_threads": max(1, int(float(values["cpus_per_trial"]))),
        "download": values.get("source") == "mnist",
    })
    return space


def load_digits(args: SweepArgs) -> GreyDigits:
    """Read the grey digits once in the driver; trials get them through the object store."""
    from unbiased.benchmarks.colored_mnist import load_grey_digits
    from unbiased.data import DataError

    try:
        return load_grey_digits(str(args["source"]), args.values.get("root"),
                                download=args["source"] == "mnist")
    except DataError as exc:
        raise SweepError(str(exc)) from None


def main(argv: list[str] | None = None, *, prog: str = "digits_grid.py",
         description: str = __doc__.splitlines()[0], presets: dict | None = None,
         experiment: str = EXPERIMENT) -> int:
    """The digits grid; k_ablation.py runs it with its own presets and experiment name."""
    presets = DIGITS if presets is None else presets
    parser = build_parser(prog, description, presets)
    args = resolve(parser, "digits", presets, argv,
                   name=None if experiment == EXPERIMENT else experiment)
    try:
        check_out_dir(args, experiment)
        digits = load_digits(args)
        n_trials = (len(args["sigma"]) * len(args["lam"]) * len(args["K"])
                    * len(args["seeds"]))
        print(f"{experiment}: preset {args.preset}, {n_trials} trials "
              f"({len(digits.train_y)} train / {len(digits.test_y)} test digits from "
              f"{digits.source}), {args['epochs']} epochs each -> {args.out}", flush=True)
        init_ray(args.address)
        from ray import tune

        from trainables.digits import train_digits

        resources = {"cpu": float(args["cpus_per_trial"]), "gpu": float(args["gpus_per_trial"])}
        grid = run_tuner(args, experiment, tune.with_parameters(train_digits, digits=digits),
                         param_space(args.values), resources,
                         param_keys=("sigma", "lam", "K", "seed"), n_trials=n_trials)
        df = results_frame(grid, experiment, "digits",
                           {"sigma": "sigma", "lam": "lam", "K": "K", "seed": "seed",
                            "epochs": "epochs"})
        written = write_outputs(args, experiment, df)
    except SweepError as exc:
        fail(str(exc))
    _summary(df)
    for path in written:
        print(f"wrote {path}")
    return 0 if all_ok(df) else 1


def _summary(df) -> None:
    last = df.sort_values("epoch").groupby("trial_id").tail(1)
    cols = ["sigma", "lam", "K", "seed", "epoch", "train_acc", "test_acc", "mi", "mi_eval",
            "status"]
    print(last[cols].sort_values(["sigma", "lam", "K", "seed"]).to_string(
        index=False, float_format=lambda v: f"{v:.3f}"))


if __name__ == "__main__":
    sys.exit(main())
