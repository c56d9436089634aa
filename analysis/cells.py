"""A table's cells and how they are printed: `Cell`, markdown tables, and each of our rows
paired with the published row of the same method."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis import published
from analysis.results import lam_label

TIDY_COLUMNS = ["benchmark", "block", "row", "column", "mean", "std", "n", "source", "rule",
                "lam"]
DASH = "—"


@dataclass(frozen=True)
class Cell:
    """One number of a table. rule says how the lambda of an "ours" cell was chosen ("fixed
    λ=…" or a selection rule's name); lam is NaN for published cells and baselines."""

    benchmark: str
    block: str
    row: str
    column: str
    mean: float
    std: float
    n: int | None
    source: str
    rule: str
    lam: float = math.nan


def stat(rows: pd.DataFrame, column: str) -> tuple[float, float, int]:
    """mean, std (pandas default, ddof=1) and count of the non-NaN values of `column`."""
    if column not in rows.columns:
        return math.nan, math.nan, 0
    values = rows[column].astype(float).dropna()
    n = len(values)
    mean = float(values.mean()) if n else math.nan
    std = float(values.std()) if n > 1 else math.nan
    return mean, std, n


def fmt_num(value: float, digits: int = 3) -> str:
    return DASH if not np.isfinite(value) else f"{value:.{digits}f}"


def fmt_cell(cell: Cell) -> str:
    if not np.isfinite(cell.mean) or (cell.source == "ours" and not cell.n):
        return DASH
    text = f"{cell.mean:.3f}"
    if np.isfinite(cell.std):
        text += f" ± {cell.std:.3f}"
    if cell.source == "ours":
        extra = f"n={cell.n}"
        if np.isfinite(cell.lam) and not cell.rule.startswith("fixed"):
            extra += f", {lam_label(cell.lam)}"
        text += f" ({extra})"
    return text


def md_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    def line(items: Sequence[str]) -> str:
        return "| " + " | ".join(str(i).replace("|", "\\|") for i in items) + " |"

    lines = [line(header), "|" + "|".join("---" for _ in header) + "|"]
    lines += [line(r) for r in rows]
    return "\n".join(lines) + "\n"


def render_block(cells: list[Cell], columns: Sequence[str], corner: str) -> str:
    order = list(dict.fromkeys(c.row for c in cells))
    grid = {(c.row, c.column): c for c in cells}
    body = [[row] + [fmt_cell(grid[(row, col)]) if (row, col) in grid else DASH
                     for col in columns] for row in order]
    return md_table([corner, *columns], body)


PUBLISHED_SUFFIX = " (published)"


def partners(rows: Sequence[str]) -> dict[str, str]:
    """Each of our rows -> the published row of the same method; our rows with no published
    counterpart (hsic, grad_reversal, ...) are left out."""
    rows = list(dict.fromkeys(rows))
    pub = [r for r in rows if r.endswith(PUBLISHED_SUFFIX)]
    partner: dict[str, str] = {}
    for row in pub:
        label = published.partner_label(row[: -len(PUBLISHED_SUFFIX)])
        for ours in rows:
            if ours not in partner and ours not in pub and (
                    ours == label or ours.startswith((label + " ", label + ","))):
                partner[ours] = row
    return partner


def paired(cells: list[Cell]) -> list[Cell]:
    """The cells reordered so that each published row comes right after our rows of the
    same method (in the paper's order); our rows with no published counterpart come last."""
    rows = list(dict.fromkeys(c.row for c in cells))
    pub = [r for r in rows if r.endswith(PUBLISHED_SUFFIX)]
    rank: dict[str, float] = {row: i + 0.5 for i, row in enumerate(pub)}
    rank.update({ours: pub.index(row) for ours, row in partners(rows).items()})
    first = {row: i for i, row in enumerate(rows)}
    order = sorted(rows, key=lambda r: (rank.get(r, len(pub)), first[r]))
    position = {row: i for i, row in enumerate(order)}
    return sorted(cells, key=lambda c: position[c.row])
