"""Which grid points of a sweep are done, and every trial's rows: the trials' records.

A launch reads the records: a point whose trial ended is not run again, one that started
continues from its last checkpoint. Records go with their machine's disk; what survives is
the CSV `python -m sweeps export` writes. With `--done FILE` every point whose epochs 1..E
are all in FILE becomes a record of its own (without a checkpoint) before the launch. A row
of FILE belongs to a point when method, the data axes, lam, K and seed match; FILE's recorded
configs, and every record, must agree with the sweep on every shared setting that changes
the numbers, or the run is refused before Ray starts.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.results import CRITIC_WARNING, OK_WARNING
from sweeps.common import SweepError
from trainables.record import RecordStore, plain, trial_key
from unbiased.settings import MEMBERS_KEY, SETTINGS_KEY, flat_point, member_key

# Shared settings that do not change a trial's numbers: where the data is, how many threads.
_NOT_COMPARED = frozenset({"root", "device", "num_threads", "cpus_per_trial",
                           "gpus_per_trial"})


def read_done(path: Path, keys: tuple[str, ...]) -> pd.DataFrame:
    try:
        rows = pd.read_csv(path)
    except (OSError, ValueError) as exc:
        raise SweepError(f"--done {path}: cannot read it as CSV ({exc})") from None
    # K: 0 where absent; a tuning preset's arm and draw: its points match on them
    need = [k for k in (*keys, "epoch") if k not in ("K", "arm", "draw")]
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
        if key == SETTINGS_KEY:
            continue  # drawn settings: the point's arm and draw name them
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


def _recorded_config(own: pd.DataFrame) -> dict | None:
    """The flat config a trial's rows record, None where FILE has none for it."""
    recorded = own["config"].iloc[-1] if "config" in own.columns else None
    try:
        return json.loads(recorded) if isinstance(recorded, str) else None
    except ValueError:
        return None


def _check_config(where: str, point: dict, config: dict | None, fixed: dict) -> None:
    if config is None:
        return
    # A drawn setting must be what the record ran with too (another --search-seed draws
    # other settings under the same arm and draw index).
    drawn = point.get(SETTINGS_KEY) or {}
    for key, value in sorted(drawn.items()):
        if key in config and plain(config[key]) != plain(value):
            raise SweepError(f"{where}: draw {point.get('draw')} of arm {point.get('arm')} ran "
                             f"with {key}={config[key]}, this sweep draws {key}={value}: "
                             f"not the same search (--search-seed?)")
    for key, value in sorted(fixed.items()):
        if key in _NOT_COMPARED or key not in config or key in drawn:
            continue
        if plain(config[key]) != plain(value):
            tag = " ".join(f"{k}={v}" for k, v in point.items())
            raise SweepError(f"{where}: trial {tag} ran with {key}={config[key]}, this "
                             f"sweep has {key}={value}: not the same grid")


def split_done(path: Path, rows: pd.DataFrame, points: list[dict], fixed: dict
               ) -> tuple[list[dict], list[tuple[dict, pd.DataFrame]]]:
    """(points still to run, [(point, its rows)] of the points FILE holds whole)."""
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
        _check_config(f"--done {path}", point, _recorded_config(own), fixed)
        done.append((point, own))
    return todo, done


def _selection_note(own: pd.DataFrame) -> str:
    """The trial's stopping-rule note from its recorded status ("ok; <warnings>"):
    results.parquet keeps no note column. The critic's warning is recomputed from mi."""
    if "status" not in own.columns:
        return ""
    status = str(own["status"].iloc[-1])
    if not status.startswith(OK_WARNING):
        return ""
    return "; ".join(w for w in status[len(OK_WARNING):].split("; ")
                     if w and not w.startswith(CRITIC_WARNING))


def import_done(records: RecordStore, path: Path, done: list[tuple[dict, pd.DataFrame]],
                fixed: dict) -> int:
    """Every point FILE holds whole without an ended record made a record of its own."""
    for point, own in done:
        key = trial_key([point])
        record = records.read(key)
        if record is not None and record.ended is not None:
            continue
        config = _recorded_config(own)
        if config is None:  # a FILE written before configs were exported: the sweep's own
            config = {**fixed, **flat_point(point)}
        drop = {"config", "trial_id", "status", "K", *point}
        metrics = own.drop(columns=[c for c in own.columns if c in drop])
        note = _selection_note(own)
        if note and "selection_note" not in metrics.columns:
            metrics = metrics.assign(selection_note=note)
        rows = [{k: v for k, v in row.items() if not (isinstance(v, float) and math.isnan(v))}
                for row in metrics.to_dict("records")]
        records.start(key, {**config, **flat_point(point)})
        records.write(key, rows, None)
        records.end(key, f"taken over from {path}")
    return len(done)


def point_records(records: RecordStore, fixed: dict, points: list[dict] | None = None
                  ) -> dict[str, tuple[pd.DataFrame, dict, str, bool]]:
    """Each grid point's (rows, flat config, its trial's key, whether that ended) by its key,
    of `points` (every point when None); a record of other settings is refused."""
    wanted = None if points is None else {trial_key([p]): p for p in points}
    out: dict[str, tuple[pd.DataFrame, dict, str, bool]] = {}
    for record in records.read_all().values():
        rows = pd.json_normalize(record.metrics(), sep="/") if record.rows else pd.DataFrame()
        done = record.ended is not None
        for key, config, own in trial_points(rows, record.config, record.key):
            if wanted is not None and key not in wanted:
                continue  # a point this sweep does not run
            _check_config(f"the record of trial {record.key}",
                          {"trial": key} if wanted is None else wanted[key], config, fixed)
            earlier = out.get(key)
            if earlier is None or (done and not earlier[3]):
                out[key] = (own, config, record.key, done)
    return out


def trial_points(rows: pd.DataFrame, config: dict, key: str
                 ) -> list[tuple[str, dict, pd.DataFrame]]:
    """A trial's rows as (key, flat config, rows) per grid point: itself, or each member of
    a bundle (its columns under "m<i>/")."""
    members = config.get(MEMBERS_KEY)
    if members is None:
        return [(key, config, rows)]
    shared = {k: v for k, v in config.items() if k != MEMBERS_KEY}
    out = []
    for i, point in enumerate(members):
        prefix = f"{member_key(i)}/"
        own = rows[[c for c in rows.columns if c.startswith(prefix)]]
        own = own.rename(columns={c: c[len(prefix):] for c in own.columns})
        if "epoch" in own.columns:
            own = own[own["epoch"].notna()].astype({"epoch": "int64"})
        if own.empty:  # the bundle never reported an epoch (an error before its first)
            own = pd.DataFrame({"epoch": [0]})
        if "device_error" in rows.columns and rows["device_error"].notna().any():
            # the trial could not have its device: every member stopped with it
            own = own.assign(device_error=rows["device_error"].dropna().iloc[-1])
        out.append((trial_key([point]), {**shared, **flat_point(point)},
                    own.reset_index(drop=True)))
    return out
