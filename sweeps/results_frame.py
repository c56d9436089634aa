"""A sweep's trials as rows: one per trial and epoch, the columns of the results contract
(DESIGN.md) and a status saying how each trial ended."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

import pandas as pd

from analysis.results import OK_WARNING, critic_warning
from unbiased.benchmarks import all_specs
from unbiased.settings import flat_config

# Columns of results.parquet, in order: the contract of DESIGN.md plus what we add.
CONTRACT_COLUMNS = [
    "experiment", "trial_id", "benchmark", "method", "sigma", "lam", "K", "seed", "epoch",
    "mi", "train_acc", "test_acc", "time_s", "mi_eval", "loss_task", "mi_batch", "epochs",
    "start_epoch", "node", "status", "selected",
]
# Columns results.parquet keeps beyond the contract, in this order, wherever a trial has them.
KEPT_COLUMNS = (*dict.fromkeys(c for spec in all_specs() for c in spec.result_columns()
                               if c not in CONTRACT_COLUMNS),
                "node_id", "machine", "precision", "torch", "cuda", "gpu", "config",
                "mi_eval_cond", "selected_epoch", "penalty", "epoch_s", "eval_s",
                "mi_eval_s", "ckpt_s", "mi_floor", "mi_floor_cond", "selected_mi_eval",
                "selected_mi_eval_cond", "guarded_frac", "graphed", "empty_groups",
                "worst_group_loss", "dro_q_max", "dro_q_entropy", "test_worst_acc",
                "val_acc", "val_worst_acc", "val_groups", "val_min_group", "arm", "draw",
                # the critic ablation's axes (digits' critic_ablation_* presets)
                "mine_standardize", "mi_guard")
METHOD = "mi_backprop"  # the method of a trial whose config names none
STOPPED_EARLY = "stopped early (scheduler)"  # a trial the scheduler (ASHA) ended


def finished(result) -> bool:
    """A trial that reported its last epoch (or stopped itself as diverged) without error."""
    metrics = result.metrics or {}
    epochs = flat_config(result.config or {}).get("epochs")
    if result.error is not None or "epoch" not in metrics:
        return False  # a trial that never reported has no config in its result either
    return (metrics["epoch"] == epochs or bool(metrics.get("diverged"))
            or bool(metrics.get("device_error")))


def results_frame(trials: Sequence[tuple[pd.DataFrame, dict, str, object]], experiment: str,
                  benchmark: str, config_columns: dict[str, str]) -> pd.DataFrame:
    """One row per grid point and epoch, from each point's (rows, flat config, trial id,
    error); `config_columns` maps result column -> config key."""
    frames = []
    for df, config, trial_id, error in trials:
        df = df.copy()
        df["trial_id"] = trial_id
        for column, key in config_columns.items():
            if column in CONTRACT_COLUMNS or key in config:  # arm, draw: a tuning preset's
                df[column] = config.get(key, math.nan)
        df["status"] = "ok" if error is None else f"error: {_one_line(error)}"
        df["config"] = json.dumps(config, sort_keys=True, default=str)
        reported = "train_acc" in df.columns
        if (error is None and reported
                and int(df["epoch"].max()) < int(config.get("epochs", 0))):
            df["status"] = STOPPED_EARLY  # the scheduler (ASHA) stopped it
        if "diverged" in df.columns and df["diverged"].notna().any():
            # The trial stopped itself (NaN/inf loss or MI): analysis leaves it out.
            df["status"] = str(df["diverged"].dropna().iloc[-1])
        if "device_error" in df.columns and df["device_error"].notna().any():
            # The trial could not use the device it was given: stopped once, not retried.
            df["status"] = "error: " + str(df["device_error"].dropna().iloc[-1])
        if df["status"].iloc[0] == "ok":
            # Ran to the end, but its numbers come with a caveat (kept in every mean).
            warnings = [critic_warning(df)]
            if "selection_note" in df.columns and df["selection_note"].notna().any():
                warnings.append(str(df["selection_note"].dropna().iloc[-1]))
            if any(warnings):
                df["status"] = OK_WARNING + "; ".join(w for w in warnings if w)
        frames.append(df)
    df = pd.concat(frames, ignore_index=True)
    df["selected"] = selected_rows(df)
    df["experiment"] = experiment
    df["benchmark"] = benchmark
    df["method"] = df["method"].fillna(METHOD) if "method" in df.columns else METHOD
    if "K" in df.columns:
        df["K"] = df["K"].fillna(0)  # methods without K (K = 0, as the non-neural baselines)
    for col in CONTRACT_COLUMNS:
        if col not in df.columns:
            df[col] = math.nan
    df = df[CONTRACT_COLUMNS + [c for c in KEPT_COLUMNS if c in df.columns]]
    df = df.astype({"epoch": "int64", "K": "int64", "seed": "int64", "epochs": "int64",
                    "lam": "float64", "sigma": "float64", "trial_id": "string",
                    "node": "string", "status": "string"}, errors="ignore")
    for column in ("node_id", "machine"):
        if column in df.columns:
            df[column] = df[column].astype("string")
    drawn = [c for c in ("arm", "draw") if c in df.columns]  # a tuning preset's
    return df.sort_values(["sigma", "lam", "K", "seed", *drawn, "epoch"]).reset_index(drop=True)


def selected_rows(df: pd.DataFrame) -> pd.Series:
    """One True per trial: its `selected_epoch`, or its last row where it never got there."""
    chosen = (df.groupby("trial_id")["selected_epoch"].transform("max")
              if "selected_epoch" in df.columns else pd.Series(math.nan, index=df.index))
    last = df.groupby("trial_id")["epoch"].transform("max")
    return df["epoch"].eq(chosen.fillna(last)).astype(bool)


def all_ok(df: pd.DataFrame) -> bool:
    """No trial failed (stopped early or warned is not failed)."""
    status = df["status"].astype(str)
    return bool((status.isin(["ok", STOPPED_EARLY]) | status.str.startswith(OK_WARNING)).all())


def _one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return (text[-1] if text else type(err).__name__)[:300]
