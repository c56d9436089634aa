"""Biased MNIST, the benchmark of Bahng et al., "Learning De-biased Representations with
Biased Representations" (ReBias, ICML 2020; their code: clovaai/rebias,
datasets/colour_mnist.py, MIT licence). The facts below carry over from there; the code is ours.

- The digit is white (every pixel above 0) on its image's background colour.
- `rho`, the training set's colour-label correlation: of each class, a random int(n * rho)
  digits get the class's own colour; the rest is cut into chunks of ceil(rest / 9) that go to
  the nine other colours, one chunk each, in a random order.
- The test set is "unbiased" as in ReBias's tables: rho = 0.1 (`test_acc`). `biased_acc` is
  the test set at rho = 1 (ReBias's "Biased" column).
- c: the background colour's index, one-hot.
- Where we differ from ReBias (the TABLE's note): pixels in [0, 1], our LeNet, everything
  random from one generator seeded by `seed`. Their trainer.py (commit 79d1d1d, lines
  386-412) means to keep the best unbiased test accuracy's epoch but never updates its local
  best_acc, so keeps the last. Their numbers are references beside ours, not targets.
"""

from __future__ import annotations

from dataclasses import dataclass

from unbiased.benchmarks.biased_mnist import data
from unbiased.benchmarks.biased_mnist.data import build_trial
from unbiased.benchmarks.digits import spec as colored_digits
from unbiased.benchmarks.spec import (
    SMOKE,
    BenchmarkSpec,
    ColumnAxis,
    Protocol,
    PublishedRow,
    TableSpec,
    bias_strength_line,
)
from unbiased.settings import setting


@dataclass
class BiasedMnistSettings:
    rho: tuple[float, ...] = setting(
        (0.997,), "training colour-label correlations, comma-separated (ReBias: 0.99, 0.995, "
                  "0.997, 0.999)", gt=0, le=1, many=True)
    z_relu: bool = setting(False, "z = ReLU(fc2) as in the authors' digit code (default: "
                                  "linear z)")
    width: int = setting(64, "channels of the LeNet's two convolutions (paper: 64)", ge=1)


# Each preset takes the method and training values of the Colored MNIST preset of its name.
_COLOURING = ("sigma", "palette", "stroke")


def _digits_preset(name: str) -> dict[str, object]:
    return {k: v for k, v in colored_digits.DIGITS[name].items() if k not in _COLOURING}


PRESETS: dict[str, dict[str, object]] = {
    "quick": {**_digits_preset("quick"), "source": "mnist5k", "rho": [0.99, 0.997],
              "lam": [0.0, 1.0], "seeds": [0]},
    # ReBias's two strongest biases.
    "cpu": {**_digits_preset("cpu"), "source": "mnist", "rho": [0.997, 0.999],
            "lam": [0.0, 1.0], "seeds": [0]},
}
PRESETS["group_screen"] = {**PRESETS["cpu"], "rho": [0.997], **colored_digits.GROUP_LAMS}
PRESETS["groups"] = {**PRESETS["cpu"], **colored_digits.GROUP_ROWS}
for _name, _values in colored_digits.BALANCED_SCREENS.items():
    PRESETS[_name] = {**PRESETS["cpu"], "rho": [0.997], **_values}
PRESETS["balanced_rows"]["rho"] = [0.997, 0.999]
PRESETS["tune"] = {**{k: v for k, v in PRESETS["cpu"].items()
                      if k not in colored_digits.GRID_ONLY}, "rho": [0.997],
                   **colored_digits.TUNE}

# ReBias, Table 1, "Unbiased" column: accuracy on the rho = 0.1 test set per training rho
# (the EnD paper, Tartaglione et al., CVPR 2021, reprints the same numbers). No stds.
REBIAS = "Bahng et al., ICML 2020 (ReBias), Table 1, unbiased test set"
_NAN = float("nan")
PUBLISHED: tuple[PublishedRow, ...] = tuple(
    PublishedRow(row, {rho: (acc, _NAN) for rho, acc in zip((0.999, 0.997, 0.995, 0.990),
                                                           accs, strict=True)}, REBIAS)
    for row, accs in (
        ("Vanilla", (.104, .334, .721, .891)),
        ("HEX", (.108, .166, .197, .247)),
        ("LearnedMixin", (.121, .502, .782, .883)),
        ("RUBi", (.137, .430, .904, .936)),
        ("ReBias", (.227, .642, .760, .881)),
    ))
TABLE = TableSpec(
    benchmark="biased_mnist", name="Biased MNIST", table="ReBias Table 1",
    measures="unbiased test accuracy", columns=ColumnAxis(key="rho", symbol="ρ",
                                                          metric="test_acc"),
    published=PUBLISHED, corner="Training", bias_strength=True,
    note=("Test set at ρ = 0.1 (`test_acc`; ρ = 1: `biased_acc`). The published rows are "
          "ReBias's own runs on their protocol: a net of four 7x7 conv-BN-ReLU blocks "
          "(16-32-64-128) and global average pooling, Adam 1e-3, weight decay 1e-4, batch "
          "256, 80 epochs, lr / 10 every 20, inputs in [-1, 1], unseeded colourings. Their "
          "code keeps the last epoch (its best-accuracy check never updates, so best.pth is "
          "rewritten every epoch); which epoch the paper reports, its text does not say. "
          "No stds are published."),
    protocol=Protocol(
        comparable=frozenset({"cpu", "group_screen", "groups",
                              *colored_digits.BALANCED_SCREENS}),
        settings={"source": "mnist"},
        rows=colored_digits.TRAIN_ROWS,
        notes={"quick": "{preset} preset: {train_rows} training digits ({source}), {epochs} "
                        "epochs " + SMOKE}),
)


def describe(values: dict, loaded: dict) -> tuple[dict, list[str]]:
    """The share of training digits the background colour alone classifies."""
    rows = [{"rho": float(rho), "seed": int(seed),
             "colour_only_acc": round(data.colour_only_accuracy(loaded["digits"], float(rho),
                                                           int(seed)), 4)}
            for rho in values["rho"] for seed in values["seeds"]]
    return {"bias_strength": rows}, [bias_strength_line(rows, "rho", "bias strength")]


SPEC = BenchmarkSpec(
    name="biased_mnist", title="Biased MNIST",
    description="Biased MNIST grid (ReBias's Table 1): rho x method x lambda x K x seed.",
    presets=PRESETS, data_axes=("rho",), build_keys=("source", "root", "z_relu", "width"),
    load=colored_digits.load, fetch=colored_digits.fetch, describe=describe,
    build=build_trial, table=TABLE,
    settings=BiasedMnistSettings, columns=("biased_acc", "biased_worst_acc"),
    summary=("train_acc", "test_acc", "biased_acc"))
