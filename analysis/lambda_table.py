"""Per (benchmark, K, group): the final metrics per lambda, each rule's choice with its gap to
the oracle, and the Spearman correlation between final MI and test accuracy."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from analysis.cells import DASH, Cell, fmt_num, md_table
from analysis.groups import chosen, rows_at, with_shared_erm
from analysis.results import LAM_ATOL, MI_METHOD, lam_label, per_lambda, spearman
from analysis.selection import SelectionRule, mi_column
from analysis.specs import BENCHMARK_METRICS, METRIC_LABELS, data_labels, present_axes


def _sub_label(key: dict[str, object]) -> str:
    method = [str(key.get("method"))] if key.get("method") != MI_METHOD else []
    return ", ".join(method + data_labels(key)) or "all"


def _groups(finals: pd.DataFrame, bench: str, K: int) -> list[tuple[str, pd.DataFrame]]:
    """The selection groups of one (benchmark, K); a group without lam = 0 trials gets the
    shared ERM rows of its sigma / train split (run once under another method)."""
    neural = finals[(finals["benchmark"] == bench) & finals["lam"].notna()]
    g = neural[neural["K"] == K]
    keys = ["method", *present_axes(g.columns)]
    out = []
    for values, sub in g.groupby(keys, dropna=False, sort=True):
        key = dict(zip(keys, values, strict=True))
        same = rows_at(neural, ((k, key[k]) for k in keys if k != "method"))
        out.append((_sub_label(key), with_shared_erm(sub, same)))
    return out


# How the per-lambda table heads the generic metrics (each benchmark's own: METRIC_LABELS).
METRIC_NAMES = {"test_acc": "test acc", "train_acc": "train acc", "mi": "MI (nats)",
                "mi_eval": "MI, fresh T (nats)", "mi_eval_cond": "MI beyond y, fresh T (nats)",
                "epoch": "epoch", **METRIC_LABELS}


def _metrics(b: pd.DataFrame) -> list[str]:
    """The per-lambda table's metrics: the generic ones, then those the rows have."""
    extra = [m for m in ("mi_eval_cond", *BENCHMARK_METRICS)
             if m in b.columns and b[m].notna().any()]
    if "selected" in b.columns and "epoch" in b.columns:
        extra.append("epoch")  # the reported epoch (a stopping rule may pick an early one)
    return ["test_acc", "train_acc", "mi", "mi_eval", *extra]


def _lambda_rows(bench: str, block: str, label: str, table: pd.DataFrame,
                 metrics: Sequence[str], cells: list[Cell]) -> list[list[str]]:
    """One row per lambda of a group (its cells go to `cells`)."""
    rows = []
    for r in table.itertuples(index=False):
        rd = r._asdict()
        row = f"{label}, {lam_label(r.lam)}"
        texts = []
        for m in metrics:
            mean, std, n = rd.get(m, math.nan), rd.get(f"{m}_std", math.nan), rd.get(f"{m}_n", 0)
            cells.append(Cell(bench, block, row, m, mean, std, int(n), "ours",
                              f"fixed {lam_label(r.lam)}", r.lam))
            texts.append(DASH if not np.isfinite(mean) else
                         f"{mean:.3f}" + (f" ± {std:.3f}" if np.isfinite(std) else ""))
        rows.append([label, f"{r.lam:g}", *texts, str(r.n), str(r.n_excluded)])
    return rows


def _selection_rows(bench: str, block: str, label: str, group: pd.DataFrame,
                    kept: pd.DataFrame, rules: Sequence[SelectionRule],
                    cells: list[Cell]) -> list[list[str]]:
    oracle = next((r for r in rules if not r.label_free), None)
    choices = {rule.name: chosen(rule, group) for rule in rules}
    ref = choices.get(oracle.name) if oracle else None
    ref_acc = _lam_value(kept, ref.lam, "test_acc") if ref else math.nan
    rows = []
    for rule in rules:
        ch = choices[rule.name]
        if ch is None:
            rows.append([label, rule.name, DASH, DASH, DASH, DASH, "no non-diverged trial"])
            continue
        acc = _lam_value(kept, ch.lam, "test_acc")
        gap = ref_acc - acc
        cells.append(Cell(bench, block, rule.name, label, gap, math.nan, None, "ours",
                          rule.name, ch.lam))
        rows.append([label, rule.name, f"{ch.lam:g}", fmt_num(acc), fmt_num(ref_acc),
                     fmt_num(gap), ch.reason])
    return rows


def _rho_row(bench: str, block: str, label: str, kept: pd.DataFrame,
             cells: list[Cell]) -> list[str]:
    col = mi_column(kept)
    rho = spearman(kept[col], kept["test_acc"]) if len(kept) else math.nan
    note = (f"fewer than 3 lambdas ({len(kept)}): undefined" if len(kept) < 3
            else "constant MI or accuracy: undefined" if not np.isfinite(rho) else "")
    cells.append(Cell(bench, block, label, f"rho({col}, test_acc)", rho, math.nan, len(kept),
                      "ours", ""))
    return [label, str(len(kept)), col, fmt_num(rho), note]


def lambda_sections(finals: pd.DataFrame, bench: str, rules: Sequence[SelectionRule]
                    ) -> tuple[list[Cell], str]:
    cells: list[Cell] = []
    parts: list[str] = []
    b = finals[(finals["benchmark"] == bench) & finals["lam"].notna()]
    metrics = _metrics(b)
    for K in sorted(b["K"].unique()):
        k_text = f"K={K}" if K else "methods without K"
        block_l = f"per-λ final metrics, {k_text}"
        block_s = f"selection gap to oracle (test acc), {k_text}"
        block_r = f"Spearman ρ(MI, test acc), {k_text}"
        lam_rows, sel_rows, rho_rows = [], [], []
        for label, g in _groups(finals, bench, K):
            table = per_lambda(g)
            kept = table[table["n"] > 0]
            lam_rows += _lambda_rows(bench, block_l, label, table, metrics, cells)
            sel_rows += _selection_rows(bench, block_s, label, g, kept, rules, cells)
            rho_rows.append(_rho_row(bench, block_r, label, kept, cells))
        header = ["group", "λ", *[METRIC_NAMES.get(m, m) for m in metrics], "n", "excluded"]
        parts.append(f"### {bench}: {block_l}\n\n" + md_table(header, lam_rows))
        parts.append(f"### {bench}: {block_s}\n\nGap = oracle's mean test acc − the chosen "
                     f"λ's. The oracle peeks at test labels; it is a reference, not a "
                     f"method.\n\n" + md_table(["group", "rule", "λ", "test acc",
                                                  "oracle test acc", "gap", "reason"],
                                                 sel_rows))
        parts.append(f"### {bench}: {block_r}\n\nOver per-λ means; MI is `mi_eval` when every "
                     f"λ has it, else `mi`. Negative ρ: lower MI goes with higher test "
                     f"accuracy.\n\n" + md_table(["group", "λs", "MI", "ρ", "note"],
                                                 rho_rows))
    return cells, "\n".join(parts)


def _lam_value(table: pd.DataFrame, lam: float, column: str) -> float:
    hit = table[np.isclose(table["lam"], lam, rtol=0.0, atol=LAM_ATOL)]
    return float(hit[column].iloc[0]) if len(hit) and column in hit.columns else math.nan
