"""The paper's table of one benchmark, from its spec (analysis.specs.TABLE_SPECS); the builder
knows no benchmark by name."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd

from analysis import published
from analysis.cells import Cell, paired, render_block, stat
from analysis.groups import chosen, neural_methods, rows_at, with_shared_erm
from analysis.published import PublishedRow
from analysis.results import LAM_ATOL, MI_METHOD, excluded_mask, lam_label, with_lam
from analysis.selection import SelectionRule
from analysis.specs import Column, ColumnAxis, TableSpec, axis_label


def _fixed_cell(bench: str, block: str, row: str, column: str, group: pd.DataFrame,
                lam: float, metric: str) -> Cell:
    mean, std, n = stat(with_lam(group, lam), metric)
    return Cell(bench, block, row, column, mean, std, n, "ours", f"fixed {lam_label(lam)}",
                lam)


def _rule_cell(bench: str, block: str, column: str, group: pd.DataFrame, rule: SelectionRule,
               metric: str, label: str = "Ours") -> Cell:
    row = f"{label}, {rule.name}"
    choice = chosen(rule, group)
    if choice is None:
        return Cell(bench, block, row, column, math.nan, math.nan, 0, "ours", rule.name)
    mean, std, n = stat(with_lam(group, choice.lam), metric)
    return Cell(bench, block, row, column, mean, std, n, "ours", rule.name, choice.lam)


def _method_cells(bench: str, block: str, column: str, frame: pd.DataFrame,
                  methods: Sequence[str], rules: Sequence[SelectionRule], metric: str,
                  paper_lam: float) -> list[Cell]:
    """Per method: a row at its one lambda (a grid that gave it its own, --lam-of) or, when
    it ran several, at the paper's lambda; then a row per selection rule."""
    cells: list[Cell] = []
    for method in methods:
        group = with_shared_erm(frame[frame["method"] == method], frame)
        label = published.method_label(method)
        own = frame[frame["method"] == method]["lam"].astype(float)
        lams = sorted({float(v) for v in own if v > LAM_ATOL})
        lam, how = (lams[0], "") if len(lams) == 1 else (paper_lam, ", as the paper")
        cells.append(_fixed_cell(bench, block, f"{label} ({lam_label(lam)}{how})", column,
                                 group, lam, metric))
        cells += [_rule_cell(bench, block, column, group, rule, metric, label=label)
                  for rule in rules]
    return cells


def table_columns(spec: TableSpec, neural: pd.DataFrame) -> list[Column]:
    """The spec's columns; an axis gives one per value among the benchmark's neural rows, the
    metric resolved to the first candidate the rows have."""
    if isinstance(spec.columns, ColumnAxis):
        axis = spec.columns
        return [Column(axis_label(axis.symbol, v), (axis.metric,), ((axis.key, v),),
                       axis.paper_lam) for v in sorted(set(neural[axis.key].astype(float)))]
    return [Column(c.label, (next((m for m in c.metric if m in neural.columns), c.metric[0]),),
                   c.where, c.paper_lam) for c in spec.columns]


def published_value(spec: TableSpec, row: PublishedRow, column: Column
                    ) -> tuple[float, float] | None:
    """A published row's (mean, std) in one column; None where the paper has none (a sigma
    the paper did not run)."""
    if not isinstance(spec.columns, ColumnAxis):
        return row.values.get(column.label)
    axis = spec.columns
    value = float(dict(column.where)[axis.key])
    return next((v for key, v in row.values.items()
                 if abs(float(key) - value) <= axis.atol), None)


def _our_cells(spec: TableSpec, block: str, column: Column, mi: pd.DataFrame,
               neural: pd.DataFrame, baselines: list[tuple[str, pd.DataFrame]],
               rules: Sequence[SelectionRule]) -> list[Cell]:
    """Our cells of one column of one block (`mi`: mi_backprop's rows of the block's K)."""
    bench, metric = spec.benchmark, column.metric[0]
    gs, ns = rows_at(mi, column.where), rows_at(neural, column.where)
    cells = []
    for label, base in baselines:
        base = rows_at(base, column.where)
        if len(base):
            mean, std, n = stat(base, metric)
            cells.append(Cell(bench, block, label, column.label, mean, std, n, "ours",
                              "baseline"))
    # a grid runs lam = 0 once, under its first K: every K's rows share it
    erm = with_shared_erm(gs, ns)
    cells.append(_fixed_cell(bench, block, spec.erm_row, column.label, erm, 0.0, metric))
    if len(gs):
        cells.append(_fixed_cell(bench, block, spec.paper_row, column.label, gs,
                                 column.paper_lam, metric))
        cells += [_rule_cell(bench, block, column.label, erm, rule, metric) for rule in rules]
    others = [m for m in neural_methods(neural) if m != MI_METHOD]
    return cells + _method_cells(bench, block, column.label, ns, others, rules, metric,
                                 column.paper_lam)


def paper_table(spec: TableSpec, finals: pd.DataFrame, rules: Sequence[SelectionRule]
                ) -> tuple[list[Cell], str]:
    """One block per K of mi_backprop, each with our rows of every method (a lambda-free
    baseline, ERM, the paper's lambda, each rule) and the published rows beside them."""
    bench = spec.benchmark
    rows = finals[finals["benchmark"] == bench]
    neural = rows[rows["lam"].notna()]
    baselines = [(label, rows[(rows["method"] == method) & ~excluded_mask(rows)])
                 for method, label in spec.baselines]
    if neural.empty and not any(len(b) for _, b in baselines):
        return [], ""
    for column in spec.requires:
        if column not in neural.columns:
            return [], (f"### {spec.table}\n\n{bench} rows have no `{column}` column: table "
                        f"skipped.\n")
    mi = neural[neural["method"] == MI_METHOD]
    columns = table_columns(spec, neural)
    note = spec.note.format(metric={c.label: c.metric[0] for c in columns})
    unpublished = "" if spec.published else "No published rows for this table.\n\n"
    cells: list[Cell] = []
    parts: list[str] = []
    for K in sorted(mi["K"].unique()) or [None]:
        block = f"{spec.table} ({spec.measures})" + (f", K={K}" if K is not None else "")
        g = mi[mi["K"] == K] if K is not None else mi
        ours = [c for col in columns
                for c in _our_cells(spec, block, col, g, neural, baselines, rules)]
        paper = [Cell(bench, block, f"{p.row} (published)", col.label, value[0], value[1],
                      None, "published", "") for p in spec.published for col in columns
                 if (value := published_value(spec, p, col)) is not None]
        block_cells = paired(ours + paper)
        cells += block_cells
        parts.append(f"### {block}\n\n" + (f"{note}\n\n" if note else "") + unpublished
                     + render_block(block_cells, [c.label for c in columns], spec.corner))
    return cells, "\n".join(parts)
