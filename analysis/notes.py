"""The sections around the tables: which epoch the cells are, the data's bias strength, the
wall time per trial, the trials kept with a warning and those excluded."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import pandas as pd

from analysis.cells import DASH, fmt_num, md_table
from analysis.results import OK_WARNING, excluded_mask, lam_label, selected_mask
from analysis.specs import DATA_AXES, axis_value_label, data_labels


def warnings_section(finals: pd.DataFrame) -> str:
    """Trials that ran to the end with a caveat (status "ok; ..."): kept, but read them with
    it (a runaway critic, no usable estimate for the stopping rule)."""
    if "status" not in finals.columns:
        return ""
    warned = finals[finals["status"].fillna("").astype(str).str.startswith(OK_WARNING)]
    if warned.empty:
        return ""
    return ("## Trials with a warning (kept in means and selection)\n\n"
            + _trial_table(warned, "reported epoch", "warning",
                           lambda r: str(r["status"]).removeprefix(OK_WARNING)) + "\n")


def wall_section(df: pd.DataFrame) -> str:
    """Wall time per trial of each (benchmark, method, lambda): the sum of its epochs'
    `epoch_s` (`time_s`, training alone, where a row has no `epoch_s`)."""
    if df.empty or not ({"epoch_s", "time_s"} & set(df.columns)):
        return ""
    seconds = df["epoch_s"].astype(float) if "epoch_s" in df.columns else \
        pd.Series(math.nan, index=df.index)
    if "time_s" in df.columns:
        seconds = seconds.fillna(df["time_s"].astype(float))
    frame = df.assign(seconds=seconds, lam=df["lam"].astype(float).fillna(-1.0))
    per_trial = frame.groupby(["benchmark", "method", "lam", "trial_id"], dropna=False).agg(
        seconds=("seconds", "sum"), epochs=("epoch", "nunique"))
    rows = []
    for (bench, method, lam), g in per_trial.groupby(level=[0, 1, 2], sort=True):
        minutes = g["seconds"] / 60.0
        std = f" ± {minutes.std():.1f}" if len(g) > 1 else ""
        rows.append([bench, method, lam_label(lam) if lam >= 0 else DASH, str(len(g)),
                     f"{g['epochs'].mean():.1f}", f"{minutes.mean():.1f}{std}",
                     f"{(g['seconds'] / g['epochs']).mean() / 60.0:.2f}",
                     f"{minutes.sum() / 60.0:.2f}"])
    return ("## Wall time per trial\n\nThe sum of each trial's `epoch_s` (training, "
            "evaluation, checkpoint), as the sweep ran its trials side by side; mean ± std "
            "over trials.\n\n"
            + md_table(["benchmark", "method", "λ", "trials", "epochs", "min / trial",
                        "min / epoch", "hours in all"], rows) + "\n")


def excluded_section(finals: pd.DataFrame) -> str:
    bad = finals[excluded_mask(finals)]
    text = "## Diverged or failed trials (excluded from means and selection)\n\n"
    if bad.empty:
        return text + "None.\n"
    return text + _trial_table(bad, "final epoch", "reason",
                               lambda r: str(r.get("reason", "") or "excluded"))


def _trial_table(trials: pd.DataFrame, epoch: str, last: str,
                 text: Callable[[pd.Series], str]) -> str:
    """A row per trial in grid order: its point on the data axes ("σ=0.030", "train EB1", or
    a dash), its epoch (headed `epoch`) and `text` of the row (headed `last`)."""
    keys = ["benchmark", "K", *(a for a in DATA_AXES if a in trials.columns), "lam", "seed"]
    rows = [[r["benchmark"], str(r["trial_id"]), r["method"], f"{r['lam']:g}",
             ", ".join(data_labels(r)) or DASH, str(r["K"]), str(r["seed"]), str(r["epoch"]),
             text(r)] for _, r in trials.sort_values(keys).iterrows()]
    return md_table(["benchmark", "trial_id", "method", "λ", "data", "K", "seed", epoch, last],
                    rows)


# What a benchmark's `describe` records per data point and seed (OUT/experiment.json's
# `bias_strength`): the training accuracy of the best classifier that sees only the bias.
BIAS_VALUE = "colour_only_acc"


def bias_section(bias: Sequence[dict]) -> str:
    """The data's bias strength: a column per value of the data axis the records have, a row
    per value of their other settings (e.g. palette and stroke), each a mean over seeds."""
    frame = pd.DataFrame(list(bias))
    axes = [a for a in DATA_AXES if a in frame.columns]
    if frame.empty or BIAS_VALUE not in frame.columns or not axes:
        return ""
    axis = axes[0]
    settings = [k for k in frame.columns if k not in (axis, "seed", BIAS_VALUE)]
    values = sorted(frame[axis].astype(float).unique())
    rows = []
    for key, g in (frame.groupby(settings, sort=True) if settings else [((), frame)]):
        means = g.groupby(axis)[BIAS_VALUE].mean()
        rows.append([", ".join(map(str, key)) or "all"]
                    + [fmt_num(float(means[v])) if v in means.index else "–" for v in values])
    return ("### Bias strength\n\nThe training accuracy of the best classifier that sees "
            "only the bias attribute c (the share of training images it classifies; 0.1 = no "
            "bias), mean over seeds.\n\n"
            + md_table([", ".join(settings) or "data"]
                       + [axis_value_label(axis, v) or f"{v:g}" for v in values], rows))


def cell_source(df: pd.DataFrame) -> str:
    """Which epoch of a trial the cells are: the one a label-free stopping rule picked
    (`selected`, see `final_rows`) where the rows mark one, else the last."""
    if selected_mask(df).any():
        return ("each trial's reported epoch (the one its label-free stopping rule picked, "
                "column `epoch` below; its last epoch where the rule picked none)")
    return "each trial's final-epoch value"
