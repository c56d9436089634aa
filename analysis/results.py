"""Read and check `results.parquet` (docs/DESIGN.md, "Results contract"), and reduce it to one
final row per trial.

A trial is *excluded* (diverged or failed) when its `status` starts with "diverged" or "error",
or its final `mi` / `train_acc` / `loss_task` is NaN or inf (`mi` and `loss_task` only for rows
with a lambda; `mi` only for methods that report a finite one somewhere, as methods without an
MI estimator of their own report NaN; `loss_task` only where the trial recorded it). Excluded
trials are listed, never averaged or chosen.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.specs import AXIS_KINDS, BENCHMARK_METRICS, TABLE_SPECS
from unbiased.stopping import FLOOR_MARGIN_NATS

RESULTS_FILE = "results.parquet"

# column -> kind; kinds: "string", "float" (int accepted and widened), "integer".
REQUIRED_COLUMNS: dict[str, str] = {
    "experiment": "string", "trial_id": "string", "benchmark": "string", "method": "string",
    "lam": "float", "K": "integer", "seed": "integer", "epoch": "integer", "mi": "float",
    "train_acc": "float", "test_acc": "float", "time_s": "float", "mi_eval": "float",
}
# Optional columns are checked only when present; integers among them may also be floats.
# Besides the generic ones: every registered benchmark's data axes and metrics.
OPTIONAL_COLUMNS: dict[str, str] = {
    **AXIS_KINDS,
    **{metric: "float" for metric in BENCHMARK_METRICS},
    "loss_task": "float", "epochs": "float", "mi_eval_cond": "float",
    "selected_mi_eval": "float", "selected_mi_eval_cond": "float", "status": "string",
    "node": "string",
}
MI_METHOD = "mi_backprop"
# A trial's own DV estimate below this means its statistics network is worse than a constant
# by a factor e^5 on the rows it was fitted to: the model found z where T is wrong (a raw
# critic at seed 7 on full MNIST read -25 nats at epoch 7, -768 at 12; docs/MEASURED.md,
# "What keeps lam = 1 up on every seed"), so its gradient said nothing about colour.
RUNAWAY_NATS = -5.0
# Statuses of trials that ran to the end but carry a warning start with this.
OK_WARNING = "ok; "
METRICS: tuple[str, ...] = tuple(dict.fromkeys(
    ("test_acc", "train_acc", "mi", "mi_eval", "mi_eval_cond", *BENCHMARK_METRICS,
     "loss_task", "epoch")))
LAM_ATOL = 1e-9


class ResultsError(ValueError):
    """results.parquet breaks the contract; the message is one line naming the column."""


def _check_column(name: str, s: pd.Series, kind: str, strict_int: bool) -> pd.Series:
    dtype = s.dtype
    where = f"{RESULTS_FILE}: column {name!r}"
    if kind == "string":
        is_object = pd.api.types.is_object_dtype(dtype)
        if pd.api.types.is_string_dtype(dtype) and (not is_object or pd.api.types.infer_dtype(
                s, skipna=True) in ("string", "empty")):
            return s.astype("object").where(s.notna(), None)
        if is_object and s.isna().all():
            return s.astype("object")
        raise ResultsError(f"{where} has dtype {dtype}, expected string")
    if pd.api.types.is_bool_dtype(dtype):
        raise ResultsError(f"{where} has dtype {dtype}, expected "
                           f"{'integer' if kind == 'integer' and strict_int else 'float'}")
    if kind == "integer" and strict_int:
        if not pd.api.types.is_integer_dtype(dtype):
            raise ResultsError(f"{where} has dtype {dtype}, expected integer")
        if s.isna().any():
            raise ResultsError(f"{where} has missing values, expected integer")
        return s.astype("int64")
    if pd.api.types.is_integer_dtype(dtype) or pd.api.types.is_float_dtype(dtype):
        return pd.Series(s.to_numpy(dtype="float64", na_value=np.nan), index=s.index, name=name)
    if pd.api.types.is_object_dtype(dtype) and s.isna().all():
        return pd.Series(np.full(len(s), np.nan), index=s.index, name=name)
    raise ResultsError(f"{where} has dtype {dtype}, expected float")


def validate(df: pd.DataFrame) -> pd.DataFrame:
    """Check columns and dtypes; return a copy with normalised dtypes (object strings,
    float64, int64)."""
    out = df.copy()
    for name, kind in REQUIRED_COLUMNS.items():
        if name not in out.columns:
            raise ResultsError(f"{RESULTS_FILE}: column {name!r} is missing")
        out[name] = _check_column(name, out[name], kind, strict_int=True)
    for name, kind in OPTIONAL_COLUMNS.items():
        if name in out.columns:
            out[name] = _check_column(name, out[name], kind, strict_int=False)
    bad = sorted(set(out["benchmark"].dropna()) - set(TABLE_SPECS))
    if bad:
        *rest, last = TABLE_SPECS
        raise ResultsError(f"{RESULTS_FILE}: column 'benchmark' has unknown value {bad[0]!r}, "
                           f"expected {', '.join(rest)} or {last}")
    if (out["epoch"] < 0).any():
        raise ResultsError(f"{RESULTS_FILE}: column 'epoch' has negative values")
    return out.reset_index(drop=True)


def load_results(results_dir: str | Path) -> pd.DataFrame:
    """Read `results_dir/results.parquet` and validate it (FileNotFoundError, ResultsError)."""
    path = Path(results_dir) / RESULTS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    try:
        df = pd.read_parquet(path)
    except Exception as exc:  # pyarrow raises several types for a corrupt file
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ResultsError(f"{RESULTS_FILE}: cannot read ({first})") from None
    return validate(df)


def _nonfinite(value: object) -> bool:
    try:
        return not math.isfinite(float(value))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return True


def methods_reporting_mi(df: pd.DataFrame) -> set[str]:
    """Methods with a finite `mi` in some row; the others have no MI estimator of their own."""
    if "mi" not in df.columns or "method" not in df.columns:
        return set()
    finite = np.isfinite(df["mi"].to_numpy(dtype=float))
    return set(df.loc[finite, "method"].dropna().astype(str))


def _exclusion_reason(trial: pd.DataFrame, final: pd.Series, mi_methods: set[str]) -> str:
    status = trial["status"].dropna().astype(str) if "status" in trial.columns else pd.Series()
    for text in status:
        if text.startswith("diverged") or text.startswith("error"):
            return text
    is_mi_method = not _nonfinite(final["lam"])
    reports_mi = is_mi_method and str(final.get("method")) in mi_methods
    checks = ["train_acc"] + (["mi"] if reports_mi else [])
    for col in checks:
        if _nonfinite(final[col]):
            return f"final {col} is {final[col]}"
    if is_mi_method and "loss_task" in trial.columns:
        recorded = np.isfinite(trial["loss_task"].to_numpy(dtype=float)).any()
        value = final["loss_task"]
        if (isinstance(value, float) and math.isinf(value)) or (
                recorded and _nonfinite(value)):
            return f"final loss_task is {value}"
    return ""


def selected_mask(df: pd.DataFrame) -> pd.Series:
    """Rows a label-free stopping rule marked as its trial's reported epoch (`selected`)."""
    if "selected" not in df.columns:
        return pd.Series(False, index=df.index)
    return df["selected"].fillna(False).astype(bool)


def final_rows(df: pd.DataFrame) -> pd.DataFrame:
    """One row per trial: the row marked `selected` (a label-free stopping rule's epoch), else
    the last, plus `excluded` (bool) and `reason` (str, empty for kept trials)."""
    columns = list(df.columns) + [f"{c}_at_selection" for c in ("mi_eval", "mi_eval_cond")
                                  if f"selected_{c}" in df.columns and c in df.columns] \
        + ["estimator_failed", "excluded", "reason"]
    if df.empty:
        return pd.DataFrame(columns=columns)
    ordered = df.sort_values(["trial_id", "epoch"], kind="stable")
    picked = selected_mask(ordered)
    has_pick = picked.groupby(ordered["trial_id"]).transform("any")
    last = ~ordered.duplicated("trial_id", keep="last")
    finals = ordered[(picked & has_pick) | (last & ~has_pick)].groupby(
        "trial_id", sort=True).tail(1).set_index("trial_id", drop=False)
    mi_methods = methods_reporting_mi(df)
    reasons = {tid: _exclusion_reason(trial, finals.loc[tid], mi_methods)
               for tid, trial in ordered.groupby("trial_id", sort=True)}
    finals = finals.reset_index(drop=True)
    finals["estimator_failed"] = estimator_failed(finals)
    # The reported epoch's MI as estimated again with another seed (the trial's last row):
    # the estimate its stopping rule minimised is biased low by the choice itself.
    for col in ("mi_eval", "mi_eval_cond"):
        again = f"selected_{col}"
        if again in ordered.columns and col in finals.columns:
            last = ordered.groupby("trial_id", sort=False)[again].last()
            redone = finals["trial_id"].map(last).astype(float)
            finals[f"{col}_at_selection"] = finals[col]
            finals[col] = redone.where(redone.notna(), finals[col])
    finals["reason"] = finals["trial_id"].map(reasons).astype(object)
    finals["excluded"] = finals["reason"] != ""
    return finals[columns]


def estimator_failed(rows: pd.DataFrame) -> pd.Series:
    """Rows whose fresh estimate of z (`mi_eval` or `mi_eval_cond`) reads more than
    FLOOR_MARGIN_NATS below its prediction floor (`mi_floor`, `mi_floor_cond`): the stopping
    rule's own test of a failed estimator (unbiased/stopping.py). No floor: False."""
    failed = pd.Series(False, index=rows.index)
    for value, floor in (("mi_eval", "mi_floor"), ("mi_eval_cond", "mi_floor_cond")):
        if value in rows.columns and floor in rows.columns:
            v = rows[value].to_numpy(dtype=float)
            f = rows[floor].to_numpy(dtype=float)
            with np.errstate(invalid="ignore"):
                failed |= np.isfinite(f) & (v < f - FLOOR_MARGIN_NATS)
    return failed


CRITIC_WARNING = "own critic ran away"  # how critic_warning's text begins


def critic_warning(trial: pd.DataFrame) -> str:
    """'' or why a trial's own critic cannot be trusted: its DV estimate ran far below 0."""
    if "mi" not in trial.columns:
        return ""
    mi = trial["mi"].astype(float)
    if not (mi < RUNAWAY_NATS).any():
        return ""
    worst = trial.loc[mi.idxmin()]
    first = int(trial.loc[mi < RUNAWAY_NATS, "epoch"].min())
    return (f"{CRITIC_WARNING}: its mi fell below {RUNAWAY_NATS:g} nats from epoch "
            f"{first} ({float(worst['mi']):.1f} at epoch {int(worst['epoch'])})")


def excluded_mask(finals: pd.DataFrame) -> pd.Series:
    """Which final rows are diverged/failed, also on frames without `final_rows`' `excluded`."""
    if "excluded" in finals.columns:
        return finals["excluded"].astype(bool)
    mask = pd.Series(False, index=finals.index)
    if "status" in finals.columns:
        status = finals["status"].fillna("").astype(str)
        mask |= status.str.startswith("diverged") | status.str.startswith("error")
    mask |= ~np.isfinite(finals["train_acc"].to_numpy(dtype=float))
    has_lam = np.isfinite(finals["lam"].to_numpy(dtype=float))
    reports_mi = finals["method"].astype(str).isin(methods_reporting_mi(finals)).to_numpy() \
        if "method" in finals.columns else True
    mask |= has_lam & reports_mi & ~np.isfinite(finals["mi"].to_numpy(dtype=float))
    if "loss_task" in finals.columns:
        mask |= has_lam & np.isinf(finals["loss_task"].to_numpy(dtype=float))
    return mask


def per_lambda(finals: pd.DataFrame) -> pd.DataFrame:
    """The kept final rows of one group per lambda (ascending; a lambda whose trials were all
    excluded has n == 0 and NaN metrics): `lam`, `n`, `n_excluded`, `n_failed` (kept trials
    whose fresh estimate failed, where `finals` says), and per metric `<m>` (mean, skipping
    NaN), `<m>_std` (ddof=1), `<m>_n`. `mi_eval` is NaN for a lambda unless every kept seed
    has one."""
    excluded = excluded_mask(finals)
    kept = finals[~excluded]
    lams = sorted(set(finals["lam"].dropna().astype(float)))
    metrics = [m for m in METRICS if m in finals.columns]
    rows = []
    for lam in lams:
        sel = kept[np.isclose(kept["lam"].astype(float), lam, rtol=0.0, atol=LAM_ATOL)]
        n_bad = int((excluded & np.isclose(finals["lam"].astype(float), lam, rtol=0.0,
                                           atol=LAM_ATOL)).sum())
        row: dict[str, float | int] = {"lam": lam, "n": len(sel), "n_excluded": n_bad}
        if "estimator_failed" in sel.columns:
            row["n_failed"] = int(sel["estimator_failed"].fillna(False).astype(bool).sum())
        for m in metrics:
            values = sel[m].astype(float)
            row[m] = float(values.mean()) if values.notna().any() else math.nan
            row[f"{m}_std"] = float(values.std()) if values.notna().sum() > 1 else math.nan
            row[f"{m}_n"] = int(values.notna().sum())
        if "mi_eval" in metrics and len(sel) and sel["mi_eval"].isna().any():
            row["mi_eval"] = math.nan
        rows.append(row)
    if not rows:
        return pd.DataFrame({"lam": pd.Series(dtype=float), "n": pd.Series(dtype=int),
                             "n_excluded": pd.Series(dtype=int)})
    return pd.DataFrame(rows)


def with_lam(finals: pd.DataFrame, lam: float) -> pd.DataFrame:
    """The kept final rows whose lambda equals `lam` (within 1e-9)."""
    kept = finals[~excluded_mask(finals)]
    return kept[np.isclose(kept["lam"].astype(float), lam, rtol=0.0, atol=LAM_ATOL)]


def spearman(x: pd.Series | np.ndarray, y: pd.Series | np.ndarray) -> float:
    """Spearman rank correlation (average ranks for ties, then Pearson); NaN when fewer than 3
    complete pairs or a side is constant."""
    frame = pd.DataFrame({"x": np.asarray(x, dtype=float),
                          "y": np.asarray(y, dtype=float)}).dropna()
    if len(frame) < 3:
        return math.nan
    return float(frame["x"].rank().corr(frame["y"].rank()))


def lam_label(lam: float) -> str:
    return f"λ={lam:g}"
