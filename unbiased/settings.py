"""A setting is declared once: a config dataclass field whose metadata carries its flag's
help, choices and bounds, so a flag cannot drift from its field. Nothing here imports torch.

The same checks run on the command line and, by `setting_problems`, on a config made in
Python or read from JSON; a config's `problems()` adds only what relates several fields.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from unbiased.stopping import SELECT_EPOCH_RULES

METADATA_KEY = "setting"
DEVICES: tuple[str, ...] = ("auto", "cpu", "cuda")
_KINDS: dict[str, type] = {"bool": bool, "int": int, "float": float, "str": str}


@dataclass(frozen=True)
class Setting:
    """`axis`: the sweep drivers take a list of values (its flag is written by hand in
    sweeps/cli.py). `many`: a comma-separated list, each item read by `convert`."""

    help: str
    choices: tuple[str, ...] | None = None
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    axis: bool = False
    many: bool = False
    convert: Callable[[str], Any] | None = None

    def problem(self, value: float) -> str | None:
        return bounds(ge=self.ge, gt=self.gt, le=self.le, lt=self.lt)(value)


def bounds(ge: float | None = None, gt: float | None = None, le: float | None = None,
           lt: float | None = None) -> Callable[[float], str | None]:
    """A check of one number: None, or why not ("must be in [0, 1]")."""
    low, high = (ge if ge is not None else gt), (le if le is not None else lt)

    def problem(value: float) -> str | None:
        if isinstance(value, float) and not math.isfinite(value):
            return "must be finite"
        low_ok = low is None or (value >= low if ge is not None else value > low)
        high_ok = high is None or (value <= high if le is not None else value < high)
        if low_ok and high_ok:
            return None
        if low is not None and high is not None:
            return (f"must be in {'[' if ge is not None else '('}{low:g}, "
                    f"{high:g}{']' if le is not None else ')'}")
        if low is not None:
            return f"must be {'>=' if ge is not None else '>'} {low:g}"
        return f"must be {'<=' if le is not None else '<'} {high:g}"
    return problem


def setting(default: Any, help: str, *, choices: tuple[str, ...] | None = None,
            ge: float | None = None, gt: float | None = None, le: float | None = None,
            lt: float | None = None, axis: bool = False, many: bool = False,
            convert: Callable[[str], Any] | None = None) -> Any:
    meta = Setting(help=help, choices=None if choices is None else tuple(choices), ge=ge,
                   gt=gt, le=le, lt=lt, axis=axis, many=many, convert=convert)
    return dataclasses.field(default=default, metadata={METADATA_KEY: meta})


def setting_of(f: dataclasses.Field) -> Setting | None:
    return f.metadata.get(METADATA_KEY)


def kind_of(f: dataclasses.Field) -> type:
    """bool, int, float or str, `| None` dropped; of a list setting, its items'."""
    if isinstance(f.type, str):
        text = f.type.strip()
        if text.startswith("tuple[") and text.endswith(", ...]"):
            text = text[len("tuple["):-len(", ...]")]
        names = [part.strip() for part in text.split("|") if part.strip() != "None"]
        if len(names) == 1 and names[0] in _KINDS:
            return _KINDS[names[0]]
    elif f.type in _KINDS.values():
        return f.type
    raise TypeError(f"setting {f.name}: type {f.type!r} is not one of bool, int, float, str "
                    f"(optionally | None, or a tuple of one of them)")


def setting_problems(config: Any) -> list[str]:
    """One phrase for each field that is wrong ("lr must be > 0, got 0.0")."""
    problems = []
    for f in dataclasses.fields(config):
        meta = setting_of(f)
        if meta is None:
            continue
        value = getattr(config, f.name)
        if value is None:
            if "None" not in str(f.type):
                problems.append(f"{f.name} must be set, got None")
            continue
        for item in (value if meta.many and isinstance(value, tuple | list) else [value]):
            problem = _value_problem(kind_of(f), meta, item)
            if problem:
                problems.append(f"{f.name} {problem}, got {item!r}")
                break
    return problems


def _value_problem(kind: type, meta: Setting, value: Any) -> str | None:
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if kind is bool and not isinstance(value, bool):
        return "must be true or false"
    if kind is int and not (number and float(value).is_integer()):
        return "must be an integer"
    if kind is float and not number:
        return "must be a number"
    if kind is str and not isinstance(value, str):
        return "must be a string"
    if meta.choices is not None and value not in meta.choices:
        return f"must be one of {', '.join(meta.choices)}"
    return meta.problem(value) if number else None


def own_fields(cls: type) -> list[dataclasses.Field]:
    own = cls.__dict__.get("__annotations__", {})
    return [f for f in dataclasses.fields(cls) if f.name in own]


# Config keys the trial loop and the sweeps share, here so both read them from one place.
WARM_FROM = "warm_from"  # the key of the lam = 0 trial a warm start starts from
POINT_KEY = "point"
MEMBERS_KEY = "members"  # a bundle trial's point: its grid points under this key
SETTINGS_KEY = "settings"  # a tuning preset's drawn settings, within the point
RECORDS_KEY = "records_at"  # where a Tune trial's record lives: no part of its settings


def flat_config(config: dict) -> dict:
    return {**{k: v for k, v in config.items() if k not in (POINT_KEY, RECORDS_KEY)},
            **flat_point(config.get(POINT_KEY) or {})}


def flat_point(point: dict) -> dict:
    return {**{k: v for k, v in point.items() if k != SETTINGS_KEY},
            **(point.get(SETTINGS_KEY) or {})}


def member_key(index: int) -> str:
    """The prefix of a bundle member's columns in its trial's reports ("m<i>/...")."""
    return f"m{index}"


@dataclass
class TrialSettings:
    """What a trial reads from its config besides the method's settings."""

    device: str = setting("auto", "training device (auto: cuda when the trial has a GPU)",
                          choices=DEVICES)
    mi_eval_steps: int = setting(
        2000, "training steps of the fresh statistics network behind mi_eval", ge=1)
    # A fresh critic every epoch would cost more than the training on a long schedule
    # (docs/MEASURED.md, "The GPU path on an H200").
    mi_eval_every: int = setting(
        1, "with a label-free --select-epoch: re-estimate MI every N epochs (and at the last) "
           "and pick among those epochs", ge=1)
    # Where c nearly fixes y (Biased MNIST) plain mi_eval reads about I(y; c) at every lam;
    # under group-balanced weights it reads the colour z carries alone (docs/METRICS.md).
    mi_eval_weights: str = setting(
        "none", "groups = mi_eval, mi_eval_cond and their floors under group-balanced "
                "weights (every (y, c) group of the benchmark the same weight), so the "
                "label-free rules read them so; none = the rows as drawn",
        choices=("none", "groups"))
    # z of every training row costs more than the estimates on CPU (24 s of a LeNet on
    # 54,000 rows against 4 s an estimate).
    mi_eval_group_rows: int = setting(
        0, "under --mi-eval-weights groups: estimate on at most N training rows of each "
           "group, drawn by the seed (every row of a smaller group); 0 = every row", ge=0)
    val_frac: float = setting(
        0.0, "hold out this fraction of the training rows, drawn uniformly (with their "
             "bias) by the seed, as a validation split: val_acc and val_worst_acc every "
             "epoch, for the validation selection rules; 0 = none", ge=0, lt=1)
    select_epoch: str = setting(
        "last", "which epoch a trial reports: last, or lowest_mi / lowest_mi_cond "
                "(label-free stopping rules: mi_eval / mi_eval_cond every epoch, the lowest "
                "among epochs that fit the training data and read above their prediction "
                "floor; its row gets selected = True)", choices=SELECT_EPOCH_RULES)
    warm_start: bool = setting(
        False, "a trial with lam > 0 starts from the last checkpoint of the lam = 0 trial of "
               "its grid point and seed (g and f with their BN statistics and optimiser "
               "state), which the grid runs first: Kim et al. fine-tune LNTL from a trained "
               "baseline")
    deterministic: bool = setting(
        False, "deterministic cuDNN and algorithms, TF32 off: on a GPU the same config and "
               "seed then repeat their numbers, as on CPU (slower)")
    # torch leaves matmul TF32 off and cuDNN's on: a float32 convolution on a GPU is TF32
    # already unless --deterministic; each epoch's `precision` says which held.
    tf32: bool = setting(
        False, "TF32 float32 matmuls on a GPU (10-bit mantissas on tensor cores; cuDNN's "
               "convolutions use TF32 by torch's default either way); not with "
               "--deterministic")


def trial_rule_problems(values: dict) -> list[str]:
    if values.get("tf32") and values.get("deterministic"):
        return ["--tf32 rounds float32 matmuls to TF32 and --deterministic turns TF32 off: "
                "give one of them"]
    return []
