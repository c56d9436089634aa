"""Every finished epoch of a sweep as one CSV: what `--done` reads (sweeps/finished_trials.py)
to continue the grid on another machine, and what bench/results/ keeps of each sweep.

Reads OUT/results.parquet, else the trials' records under OUT/tune (a sweep stopped mid-way),
else Tune's per-epoch results (a sweep run before records). An existing DEST is merged: a
trial this run lacks or holds fewer epochs of keeps DEST's rows, so exporting back into the
CSV a run continued never loses a finished epoch.

    python -m sweeps export OUT bench/results/NAME/epochs.csv
    python -m sweeps export PIECE/epochs.csv CSV      # a piece's rows (sweeps/piece.py)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from analysis.io import atomic_write_text
from analysis.specs import DATA_AXES
from sweeps.results_frame import CONTRACT_COLUMNS, KEPT_COLUMNS
from unbiased.settings import flat_config

# One trial's keys (K: 0 for methods without one), with its data point's axes.
POINT_KEYS = ["method", "K", "lam", "seed"]
# Axes some sweeps add (digits' critic ablation; a tuning preset's): part of a trial's key.
AXIS_KEYS = ["mine_standardize", "mi_guard", "arm", "draw"]
# The CSV's leading columns, as every export so far wrote them (digits' sigma among them).
TRIAL_KEYS = ["method", "K", "sigma", "lam", "seed"]
COLUMNS = [*TRIAL_KEYS, "epoch", "train_acc", "test_acc", "mi", "penalty",
           "mi_eval", "mi_eval_cond", "mi_floor", "mi_floor_cond", "time_s", "epoch_s",
           "selected_epoch", "selected_mi_eval", "selected_mi_eval_cond",
           # what `--done` needs to take a trial over: its id, status and full config
           "trial_id", "status", "config"]


def trial_keys(df: pd.DataFrame) -> list[str]:
    """The columns that tell one trial of DF from another, in the CSV's sort order; an axis
    only where every row holds a value of it (digits' sigma is empty in Biased MNIST's)."""
    def has(k: str) -> bool:
        return k in df.columns and bool(df[k].notna().all())

    order = ["method", "K", *DATA_AXES, "lam", "seed", *AXIS_KEYS]
    return [k for k in order if has(k) or (k in POINT_KEYS and k in df.columns)]


def from_records(out: Path) -> pd.DataFrame:
    from pyarrow import fs

    from sweeps.finished_trials import trial_points
    from trainables.record import RecordStore

    frames = []
    for root in sorted(out.glob("tune/*/trials")):
        for record in RecordStore(fs.LocalFileSystem(), str(root)).read_all().values():
            rows = pd.json_normalize(record.metrics(), sep="/")
            for key, config, own in trial_points(rows, record.config, record.key):
                named = {k: config[k] for k in (*TRIAL_KEYS, *DATA_AXES, *AXIS_KEYS,
                                                "palette", "stroke", "lr", "batch_size")
                         if k in config}
                frames.append(own.assign(**named, trial_id=key, config=json.dumps(
                    config, sort_keys=True, default=str)))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def from_tune(out: Path) -> pd.DataFrame:
    """Tune's per-trial results of a sweep run before records (its result.json files)."""
    rows = []
    for path in sorted(out.glob("tune/*/*/result.json")):
        for line in path.read_text().splitlines():
            if line.strip():
                result = json.loads(line)
                config = flat_config(result.get("config") or {})
                # The grid point's own keys (sigma, rho, a critic's options, ...).
                axes = {k: config[k] for k in result.get("config", {}).get("point", {})}
                rows.append({**{k: config.get(k) for k in (*TRIAL_KEYS, "palette", "stroke",
                                                            "lr", "batch_size")}, **axes,
                             **result,
                             "config": json.dumps(config, sort_keys=True, default=str)})
    return pd.DataFrame(rows)


def _trial_key(row: pd.Series, keys: list[str]) -> tuple:
    """A trial's key, with numbers rounded so that 0.03 read back from a CSV is 0.03."""
    return tuple(_key_value(k, row[k]) for k in keys)


def _key_value(key: str, value: object) -> object:
    if key == "method" or (key in AXIS_KEYS and key != "draw"):
        return str(value)
    try:
        return round(float(value), 9)
    except (TypeError, ValueError):  # a named data point (IMDB's train_split)
        return str(value)


def merged(new: pd.DataFrame, old: pd.DataFrame, keys: list[str]) -> tuple[pd.DataFrame, int]:
    """`new`, with each trial that `old` holds more epochs of taken from `old`; and how many."""
    if old.empty or not set(keys) <= set(old.columns):
        return new, 0
    if "K" in old.columns:
        old = old.assign(K=old["K"].fillna(0).astype(int))
    new_key = new.apply(_trial_key, axis=1, keys=keys)
    old_key = old.apply(_trial_key, axis=1, keys=keys)
    have = new.groupby(new_key)["epoch"].nunique().to_dict()
    had = old.groupby(old_key)["epoch"].nunique().to_dict()
    from_old = {k for k, n in had.items() if n > have.get(k, 0)}
    if not from_old:
        return new, 0
    frame = pd.concat([new[~new_key.isin(from_old)], old[old_key.isin(from_old)]],
                      ignore_index=True)
    return frame, len(from_old)


def wanted_columns() -> list[str]:
    """COLUMNS, then every other column results.parquet keeps, so a trial `--done` takes over
    loses none (but those the run reading them back sets itself)."""
    return [*COLUMNS, *(c for c in (*CONTRACT_COLUMNS, *KEPT_COLUMNS) if c not in COLUMNS
                        and c not in ("selected", "experiment", "benchmark"))]


def export_frame(df: pd.DataFrame) -> pd.DataFrame:
    """Rows as the CSV holds them: the last report of each epoch, sorted by trial and epoch."""
    keys = trial_keys(df)
    # A trial restarted from a checkpoint reports its re-run epoch again: keep the last.
    df = df.drop_duplicates([*keys, "epoch"], keep="last")
    cols = [c for c in wanted_columns() if c in df.columns]
    return df.sort_values([*keys, "epoch"])[cols].reset_index(drop=True)


def read_source(out: Path) -> pd.DataFrame:
    """A sweep's rows, or a CSV of rows in this format (a piece's OUT/epochs.csv)."""
    if out.suffix == ".csv" and out.is_file():
        return read_rows_csv(out)
    parquet = out / "results.parquet"
    if parquet.is_file():
        return pd.read_parquet(parquet)
    df = from_records(out)
    df = df if not df.empty else from_tune(out)
    if "K" in df.columns:
        df["K"] = df["K"].fillna(0).astype(int)
    return df


# What a row needs to be exported: its trial's point and its epoch.
NEEDED = ("method", "lam", "seed", "epoch")


class RowsError(ValueError):
    """Rows that are not a sweep's epochs (a CSV of something else, a missing column)."""


def read_rows_csv(path: Path) -> pd.DataFrame:
    if path.stat().st_size == 0:
        return pd.DataFrame()
    try:
        df = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise RowsError(f"{path} is not a CSV of epochs: {exc}".splitlines()[0]) from None
    return checked_rows(df, str(path))


def checked_rows(df: pd.DataFrame, source: str) -> pd.DataFrame:
    missing = [c for c in NEEDED if c not in df.columns]
    if missing and not df.empty:
        raise RowsError(f"{source} holds no sweep's epochs: no column {', '.join(missing)} "
                        f"(it has {', '.join(map(str, df.columns[:8]))}"
                        + (", ..." if len(df.columns) > 8 else "") + ")")
    return df


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="export_epochs", description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path, help="the sweep's results directory, or a CSV of rows "
                                          "in this format (a piece's, sweeps/piece.py)")
    p.add_argument("dest", type=Path, help="CSV to write (an existing one is merged)")
    p.add_argument("--replace", action="store_true",
                   help="write this run's rows alone, dropping DEST's other trials")
    a = p.parse_args(argv)
    try:
        df = checked_rows(read_source(a.out), str(a.out))
        old = (read_rows_csv(a.dest) if a.dest.is_file() and not a.replace
               else pd.DataFrame())
    except RowsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if df.empty:
        print(f"error: no epochs under {a.out}", file=sys.stderr)
        return 2
    keys = trial_keys(df)
    df = export_frame(df)
    kept = 0
    if not old.empty:
        df, kept = merged(df, old, keys)
        df = export_frame(df)
    atomic_write_text(a.dest, df.to_csv(index=False))
    print(f"wrote {a.dest}: {len(df)} epochs of {df.groupby(keys).ngroups} trials"
          + (f" ({kept} of them kept from the CSV it replaced)" if kept else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
