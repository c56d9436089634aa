"""Select on some seeds, report on fresh ones (DomainBed's protocol): `picks` of a finished
sweep's label-free rules (and ERM, the reference), which `python -m sweeps rerun` runs with new
seeds, and `rerun_table` reports beside the numbers they were chosen on."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from analysis.cells import fmt_num, md_table
from analysis.groups import erm_rows, neural_methods, with_shared_erm
from analysis.results import LAM_ATOL, with_lam
from analysis.selection import NoCandidateError, default_rules
from analysis.specs import BENCHMARK_METRICS

ERM_RULE = "ERM (λ=0), reference"
SHOWN = ("test_acc", *BENCHMARK_METRICS, "train_acc", "mi_eval", "mi_eval_cond")


def _same(series: pd.Series, value: object) -> pd.Series:
    if isinstance(value, float):
        return pd.Series(np.isclose(series.astype(float), value, rtol=0.0, atol=1e-12),
                         index=series.index)
    return series.astype(object) == value


def _data_points(neural: pd.DataFrame, axes: Sequence[str]) -> list[dict[str, object]]:
    if not axes:
        return [{}]
    rows = neural[list(axes)].drop_duplicates().sort_values(list(axes))
    return [{k: (float(v) if isinstance(v, float | np.floating) else v)
             for k, v in zip(axes, row, strict=True)} for row in rows.itertuples(index=False)]


def _at(frame: pd.DataFrame, data: dict[str, object]) -> pd.DataFrame:
    mask = pd.Series(True, index=frame.index)
    for key, value in data.items():
        mask &= _same(frame[key], value)
    return frame[mask]


def _means(rows: pd.DataFrame, prefix: str = "") -> dict[str, float]:
    out: dict[str, float] = {f"{prefix}n": len(rows)}
    for m in SHOWN:
        if m in rows.columns:
            values = rows[m].astype(float)
            out[f"{prefix}{m}"] = float(values.mean()) if values.notna().any() else math.nan
            out[f"{prefix}{m}_std"] = float(values.std()) if values.notna().sum() > 1 \
                else math.nan
    return out


def picks(finals: pd.DataFrame, axes: Sequence[str]) -> pd.DataFrame:
    """One row per data point x method x K x label-free rule (the tables' groups): the lambda
    it chose and the selection seeds' means (`sel_<metric>`); plus ERM per data point."""
    rules = [r for r in default_rules() if r.label_free]
    neural = finals[finals["lam"].notna()]
    rows: list[dict[str, object]] = []
    for data in _data_points(neural, axes):
        here = _at(neural, data)
        erm = erm_rows(here)
        kept_erm = with_lam(erm, 0.0)
        if len(erm):
            rows.append({**data, "method": str(erm["method"].iloc[0]),
                         "K": int(erm["K"].iloc[0]), "lam": 0.0, "rule": ERM_RULE,
                         "reason": "plain ERM on the same seeds",
                         "selection_seeds": _seeds(kept_erm), **_means(kept_erm, "sel_")})
        for method in neural_methods(here):
            own = here[here["method"] == method]
            for K in sorted(own["K"].unique()):
                group = with_shared_erm(own[own["K"] == K], here)
                for rule in rules:
                    try:
                        choice = rule.choose(group)
                    except NoCandidateError:
                        continue
                    chosen = with_lam(group, choice.lam)
                    rows.append({**data, "method": method, "K": int(K), "lam": choice.lam,
                                 "rule": rule.name, "reason": choice.reason,
                                 "selection_seeds": _seeds(chosen),
                                 **_means(chosen, "sel_")})
    return pd.DataFrame(rows)


def _seeds(rows: pd.DataFrame) -> str:
    return ",".join(str(int(s)) for s in sorted(rows["seed"].dropna().unique()))


def rerun_table(chosen: pd.DataFrame, finals: pd.DataFrame, axes: Sequence[str],
                source: str) -> tuple[pd.DataFrame, str]:
    """Each pick of `chosen` with the re-run's means over its new seeds; tidy frame and
    markdown. lambda = 0 is plain ERM whatever the method: its rows are the re-run's ERM."""
    rows = []
    for pick in chosen.to_dict("records"):
        data = {k: pick[k] for k in axes}
        here = _at(finals[finals["lam"].notna()], data)
        if abs(float(pick["lam"])) <= LAM_ATOL:
            new = with_lam(erm_rows(here), 0.0)
        else:
            new = with_lam(here[(here["method"] == pick["method"])
                                & (here["K"] == pick["K"])], float(pick["lam"]))
        rows.append({"source": source, **pick, "seeds": _seeds(new), **_means(new)})
    tidy = pd.DataFrame(rows)
    metrics = [m for m in SHOWN if m in tidy.columns and tidy[m].notna().any()]
    header = ["from sweep", "rule", "method", "K", *axes, "λ",
              *[f"{m}, selection seeds" for m in metrics[:1]],
              *[f"{m}, new seeds" for m in metrics]]
    lines = []
    for r in tidy.to_dict("records"):
        first = metrics[0] if metrics else None
        sel = (f"{fmt_num(r.get('sel_' + first, math.nan))} ({r['selection_seeds']})"
               if first else "")
        lines.append([r["source"], r["rule"], r["method"],
                      str(r["K"]) if r["K"] else "—",
                      *[f"{r[a]:g}" if isinstance(r[a], float) else str(r[a]) for a in axes],
                      f"{r['lam']:g}", *([sel] if first else []),
                      *[_pm(r, m) for m in metrics]])
    text = (f"# Re-run of the label-free picks of {source} on new seeds\n\n"
            "Each row: a configuration a label-free rule chose in the source sweep (or its ERM "
            "reference), its mean on the seeds it was chosen on, and its mean ± std over "
            f"the new seeds ({_seeds(finals)}).\n\n" + md_table(header, lines) + "\n")
    return tidy, text


def _pm(row: dict, metric: str) -> str:
    mean, std = row.get(metric, math.nan), row.get(f"{metric}_std", math.nan)
    if not isinstance(mean, float) or math.isnan(mean):
        return "—"
    return fmt_num(mean) + ("" if math.isnan(std) else f" ± {fmt_num(std)}") + \
        f" (n={row['n']})"
