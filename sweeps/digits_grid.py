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
from sweeps.common import SweepError  # noqa: E402
from sweeps.core import GridSpec, run_grid  # noqa: E402
from sweeps.presets import DIGITS  # noqa: E402
from unbiased.benchmarks.colored_mnist import GreyDigits  # noqa: E402

EXPERIMENT = "digits_grid"
# What trainables/digits.py's build reads from a trial config.
BUILD_KEYS = ("source", "root", "z_relu", "width", "palette", "stroke")


def load_digits(args: SweepArgs) -> GreyDigits:
    """Read the grey digits once in the driver; trials get them through the object store."""
    from unbiased.benchmarks.colored_mnist import load_grey_digits
    from unbiased.data import DataError

    try:
        return load_grey_digits(str(args["source"]), args.values.get("root"),
                                download=args["source"] == "mnist")
    except DataError as exc:
        raise SweepError(str(exc)) from None


def _load(args: SweepArgs) -> tuple[dict[str, object], str]:
    digits = load_digits(args)
    return {"digits": digits}, (f"{len(digits.train_y)} train / {len(digits.test_y)} test "
                                f"digits from {digits.source}")


def bias_strength(args: SweepArgs, digits: GreyDigits) -> tuple[dict, list[str]]:
    """For each sigma and seed of the sweep, the share of training digits the colour alone
    classifies (`colored_mnist.bias_strength`), for OUT/experiment.json and table.md."""
    from unbiased.benchmarks.colored_mnist import bias_strength as strength

    # A sweep recorded before palettes and strokes were settings (a re-run of it) had the
    # build's defaults.
    palette = str(args.values.get("palette", "separated"))
    stroke = str(args.values.get("stroke", "scaled"))
    rows = [{"sigma": float(sigma), "seed": int(seed), "palette": palette, "stroke": stroke,
             "colour_only_acc": round(strength(digits, float(sigma), int(seed), palette,
                                               stroke), 4)}
            for sigma in args["sigma"] for seed in args["seeds"]]
    means = {}
    for row in rows:
        means.setdefault(row["sigma"], []).append(row["colour_only_acc"])
    line = (f"bias strength (palette {palette}, stroke {stroke}): colour alone classifies "
            + ", ".join(f"{sum(v) / len(v):.3f} at sigma {s:g}" for s, v in means.items())
            + " of the training digits")
    return {"bias_strength": rows}, [line]


def _describe(args: SweepArgs, loaded: dict) -> tuple[dict, list[str]]:
    return bias_strength(args, loaded["digits"])


def _trainable():
    from trainables.digits import train_digits

    return train_digits


def spec(prog: str = "digits_grid.py", description: str = __doc__.splitlines()[0],
         presets: dict | None = None, experiment: str = EXPERIMENT,
         data_axes: tuple[str, ...] = ("sigma",)) -> GridSpec:
    """The digits grid; k_ablation.py and critic_ablation.py are the same with their own
    presets and experiment (critic_ablation.py with the critic options as data axes)."""
    return GridSpec(
        prog=prog, description=description, experiment=experiment, benchmark="digits",
        presets=DIGITS if presets is None else presets, build_keys=BUILD_KEYS,
        data_axes=data_axes, load=_load, trainable=_trainable,
        summary_columns=("method", *data_axes, "lam", "K", "seed", "epoch", "train_acc",
                         "test_acc", "mi", "mi_eval", "status"),
        out_name=None if experiment == EXPERIMENT else experiment, describe=_describe)


SPEC = spec()


def main(argv: list[str] | None = None) -> int:
    return run_grid(SPEC, argv)


if __name__ == "__main__":
    sys.exit(main())
