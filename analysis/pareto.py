"""Pareto front of a multi-objective search (sweeps/lambda_search.py) and the lowest-MI rule on it.

Both objectives are label-free for the bias (no test labels, no unbiased validation set);
`test_acc` is carried along for reporting only.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from analysis.io import atomic_write_parquet, atomic_write_text
from analysis.results import excluded_mask
from analysis.selection import LowestMI, SelectionRule
from analysis.specs import data_labels, valued_axes

OBJECTIVES: tuple[tuple[str, str], ...] = (("mi_eval", "min"), ("train_acc", "max"))
FRONT_COLUMNS = ["trial_id", "lam", "K", "mi_eval", "train_acc", "test_acc", "mi", "chosen",
                 "rule", "reason"]


def pareto_mask(frame: pd.DataFrame) -> pd.Series:
    """True for the rows no other row dominates. Rows with a non-finite objective are never on
    the front (and dominate nothing)."""
    signs = np.array([1.0 if mode == "min" else -1.0 for _, mode in OBJECTIVES])
    values = frame[[col for col, _ in OBJECTIVES]].to_numpy(dtype=float) * signs
    finite = np.isfinite(values).all(axis=1)
    mask = np.zeros(len(frame), dtype=bool)
    pool = values[finite]
    for i in np.flatnonzero(finite):
        v = values[i]
        mask[i] = not (np.all(pool <= v, axis=1) & np.any(pool < v, axis=1)).any()
    return pd.Series(mask, index=frame.index)


def _study_key(frame: pd.DataFrame) -> list[str]:
    return [k for k in ("benchmark", *valued_axes(frame), "seed") if k in frame.columns]


def pareto_front(finals: pd.DataFrame, rule: SelectionRule | None = None) -> pd.DataFrame:
    """The front of each study (benchmark, data point, seed) among its kept final rows, with the
    rule's choice marked (`chosen`) and explained (`rule`, `reason` on the chosen row)."""
    rule = rule if rule is not None else LowestMI()
    kept = finals[~excluded_mask(finals)]
    fronts = []
    for _, study in kept.groupby(_study_key(kept), dropna=False, sort=True):
        front = study[pareto_mask(study)].assign(chosen=False, rule="", reason="")
        if front.empty:
            continue
        choice = rule.choose(front)
        at = front[np.isclose(front["lam"].astype(float), choice.lam, rtol=0.0, atol=1e-12)]
        best = at["mi_eval"].astype(float).idxmin()
        front.loc[best, ["chosen", "rule", "reason"]] = [True, choice.rule, choice.reason]
        fronts.append(front)
    study = _study_key(kept)
    if not fronts:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in [*study, *FRONT_COLUMNS]})
    out = pd.concat(fronts, ignore_index=True).reindex(columns=[*study, *FRONT_COLUMNS])
    out = out.astype({"chosen": bool, "rule": "string", "reason": "string",
                      "trial_id": "string"})
    order = [k for k in study if k != "benchmark"]
    return out.sort_values([*order, "mi_eval"]).reset_index(drop=True)


def front_markdown(front: pd.DataFrame, finals: pd.DataFrame) -> str:
    """The fronts as markdown: one table per study, the choice marked, and beside it the best
    test accuracy of any kept trial of the study (an oracle that peeks, for the gap)."""
    lines = ["# Pareto front: low mi_eval, high train_acc (label-free)\n",
             "One table per study (data point, seed), sorted by mi_eval. `*` marks the trial the "
             "lowest-MI rule chose on the front; test accuracy is shown for reference only "
             "(the choice never reads it).\n"]
    if front.empty:
        return "\n".join(lines + ["No trial finished with a finite mi_eval.\n"])
    kept = finals[~excluded_mask(finals)]
    for key, study in front.groupby(_study_key(front), dropna=False, sort=True):
        names = dict(zip(_study_key(front), key, strict=True))
        point = " ".join(data_labels(names))
        lines.append(f"## {names.get('benchmark', '')} {point} seed={names.get('seed')}\n")
        lines.append("| | λ | K | mi_eval | train acc | test acc | trial |")
        lines.append("|---|---|---|---|---|---|---|")
        for r in study.itertuples():
            lines.append(f"| {'*' if r.chosen else ''} | {r.lam:.4g} | {r.K} | "
                         f"{r.mi_eval:.4f} | {r.train_acc:.4f} | {r.test_acc:.4f} | "
                         f"{r.trial_id} |")
        chosen = study[study["chosen"]].iloc[0]
        pool = kept[(kept[list(names)] == pd.Series(names)).all(axis=1)]
        oracle = pool.loc[pool["test_acc"].astype(float).idxmax()]
        lines.append("")
        lines.append(f"Chosen: λ={chosen['lam']:.4g}, K={chosen['K']} — {chosen['reason']}. "
                     f"Test acc {chosen['test_acc']:.4f}; best test acc of the study's "
                     f"{len(pool)} trials {oracle['test_acc']:.4f} (λ={oracle['lam']:.4g}, "
                     f"K={oracle['K']}; oracle, peeks).\n")
    return "\n".join(lines)


def write_front(front: pd.DataFrame, finals: pd.DataFrame, out_dir: str | Path) -> list[Path]:
    """OUT/pareto.parquet and OUT/pareto.md."""
    out = Path(out_dir)
    return [atomic_write_parquet(front, out / "pareto.parquet"),
            atomic_write_text(out / "pareto.md", front_markdown(front, finals))]
