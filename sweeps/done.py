"""Continue a grid from the per-epoch rows an earlier run of it left (`--done FILE`).

`--resume` continues from Tune's own state in OUT; that state lives on the machine that ran
the sweep (128 MB for Table 1) and is gone when the machine is. What survives is the CSV of
every finished epoch `sweeps/export_epochs.py` writes and the team commits under
bench/results/. With `--done FILE` a new run of the same grid leaves out every trial whose
epochs 1..E are all in FILE, runs the rest, and writes results.parquet, tables and figures
from both, as one run of the whole grid would. A trial FILE holds only part of is run again
from its first epoch (its checkpoint went with the machine).

A row of FILE belongs to a grid point when method, the data axes, lam, K and seed match; a
FILE that records each trial's config (the `config` column export_epochs writes) must also
agree with the sweep on every shared setting that changes the numbers, or the run is refused
before Ray starts. A `--tracker` logs the trials this run trains, not the
ones it took over (they were logged, if at all, where they ran).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.results import CRITIC_WARNING, OK_WARNING
from sweeps.common import SweepError

DONE_FILE = "done_epochs.csv"  # OUT/<this>: the rows taken from FILE, for --resume and export
# Shared settings that do not change a trial's numbers: where the data is, how many threads.
_NOT_COMPARED = frozenset({"root", "device", "num_threads", "cpus_per_trial",
                           "gpus_per_trial"})


def read_done(path: Path, keys: tuple[str, ...]) -> pd.DataFrame:
    """FILE's rows; SweepError (one line) when it cannot be read or lacks a key column."""
    try:
        rows = pd.read_csv(path)
    except (OSError, ValueError) as exc:
        raise SweepError(f"--done {path}: cannot read it as CSV ({exc})") from None
    need = [k for k in (*keys, "epoch") if k != "K"]
    missing = [k for k in need if k not in rows.columns]
    if missing:
        raise SweepError(f"--done {path}: no column {', '.join(missing)} (expected the CSV "
                         f"sweeps/export_epochs.py writes)")
    if "K" not in rows.columns:
        rows["K"] = 0
    rows["K"] = rows["K"].fillna(0).astype(int)
    return rows


def _matches(rows: pd.DataFrame, point: dict) -> pd.Series:
    hit = pd.Series(True, index=rows.index)
    for key, value in {**point, "K": point.get("K", 0)}.items():
        if key not in rows.columns:
            return pd.Series(False, index=rows.index)
        column = rows[key]
        if isinstance(value, bool):  # a critic axis (True, read back from CSV as True/"True")
            hit &= column.astype(str).str.lower() == str(value).lower()
        elif isinstance(value, (int, float)):  # a seed read back as 0.0 is still seed 0
            hit &= np.isclose(pd.to_numeric(column, errors="coerce"), value, rtol=0.0,
                              atol=1e-9)
        else:
            hit &= column.astype(str) == str(value)
    return hit


def _plain(value: object) -> object:
    return json.loads(json.dumps(value, default=str))


def _recorded_config(own: pd.DataFrame) -> dict | None:
    """The flat config a trial's rows record, None where FILE has none for it."""
    recorded = own["config"].iloc[-1] if "config" in own.columns else None
    try:
        return json.loads(recorded) if isinstance(recorded, str) else None
    except ValueError:
        return None


def _check_config(path: Path, point: dict, config: dict | None, fixed: dict) -> None:
    if config is None:
        return
    for key, value in sorted(fixed.items()):
        if key in _NOT_COMPARED or key not in config:
            continue
        if _plain(config[key]) != _plain(value):
            tag = " ".join(f"{k}={v}" for k, v in point.items())
            raise SweepError(f"--done {path}: trial {tag} ran with {key}={config[key]}, this "
                             f"sweep has {key}={value}: not the same grid")


def split_done(path: Path, rows: pd.DataFrame, points: list[dict], fixed: dict
               ) -> tuple[list[dict], list[tuple[dict, pd.DataFrame]]]:
    """(points still to run, [(point, its rows)] for the points FILE finished)."""
    epochs = int(fixed["epochs"])
    todo: list[dict] = []
    done: list[tuple[dict, pd.DataFrame]] = []
    for point in points:
        own = rows[_matches(rows, point)].drop_duplicates("epoch", keep="last")
        own = own.sort_values("epoch")
        if set(range(1, epochs + 1)) - set(own["epoch"].astype(int)):
            todo.append(point)
            continue
        own = own[own["epoch"].astype(int) <= epochs]
        _check_config(path, point, _recorded_config(own), fixed)
        done.append((point, own))
    return todo, done


def _selection_note(own: pd.DataFrame) -> str:
    """The trial's stopping-rule note as its recorded status holds it ("ok; <warnings>"):
    results.parquet keeps no note column, and without it a trial taken over would lose the
    warning its own run gave. The critic's warning is left out: it is recomputed from mi."""
    if "status" not in own.columns:
        return ""
    status = str(own["status"].iloc[-1])
    if not status.startswith(OK_WARNING):
        return ""
    return "; ".join(w for w in status[len(OK_WARNING):].split("; ")
                     if w and not w.startswith(CRITIC_WARNING))


def done_trials(done: list[tuple[dict, pd.DataFrame]], fixed: dict
                ) -> list[tuple[pd.DataFrame, dict, str]]:
    """Each finished trial as (its epoch rows, its flat config, its trial id), the form
    sweeps/results_frame.py turns into rows of results.parquet."""
    out = []
    for point, own in done:
        config = _recorded_config(own)
        if config is None:  # a FILE written before configs were exported: the sweep's own
            config = {**fixed, **point}
        trial_id = own["trial_id"].iloc[-1] if "trial_id" in own.columns else math.nan
        if not isinstance(trial_id, str):  # unique per grid point, whichever run reads it
            trial_id = "done_" + "_".join(f"{k}{v}" for k, v in sorted(point.items()))
        drop = {"config", "trial_id", "status", "K", *point}
        metrics = own.drop(columns=[c for c in own.columns if c in drop])
        note = _selection_note(own)
        if note and "selection_note" not in metrics.columns:
            metrics = metrics.assign(selection_note=note)
        out.append((metrics.reset_index(drop=True), {**config, **point}, trial_id))
    return out
