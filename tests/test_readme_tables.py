"""README's tables of the equal-budget protocol are what the committed rows give: every cell,
read back from `bench/results/tune_protocol/` through analysis.comparison, so an edit of either
shows."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from analysis.comparison import compare, load_rows

ROOT = Path(__file__).resolve().parents[1]
ROWS = ROOT / "bench" / "results" / "tune_protocol"
# README heading -> the screen's and the rows' CSVs under ROWS
TABLES = {"### Biased MNIST (ReBias): every method on one budget": "biased_mnist",
          "### Colored MNIST σ .030: every method on one budget": "digits"}
METHOD_ARM = {
    "ERM": "erm", "Resampling (ERM on group-balanced batches)": "resampling",
    "Group reweighting": "reweighting", "Group DRO": "group_dro",
    "Kim et al. (`lntl`)": "lntl", "Ours": "ours", "Ours on balanced MI": "ours_balanced",
    "Ours on the group sampler": "ours_resampled",
}
COLUMN_RULE = {"validation accuracy": "val_acc", "validation worst group": "val_worst",
               "label-free (lowest MI)": "lowest_mi", "oracle (test labels)": "oracle"}


def _readme_table(heading: str) -> tuple[list[str], dict[str, list[str]]]:
    text = (ROOT / "README.md").read_text()
    assert heading in text, f"README has no section {heading!r}"
    section = text.split(heading, 1)[1]
    table = next(block for block in section.split("\n\n") if block.startswith("|"))
    lines = table.splitlines()
    cells = [[c.strip().strip("*") for c in line.strip("|").split("|")] for line in lines]
    header, rows = cells[0], cells[2:]
    return header[1:], {row[0]: row[1:] for row in rows}


def _cell(row: pd.Series) -> str:
    def short(x: float) -> str:
        return "0" if round(x, 3) == 0 else f"{x:.3f}".lstrip("0")
    return (f"{short(row['test_acc_mean'])} ± {short(row['test_acc_std'])} / "
            f"{short(row['test_worst_acc_mean'])}")


@pytest.mark.parametrize("heading", sorted(TABLES))
def test_readme_table_is_the_committed_rows(heading: str):
    columns, table = _readme_table(heading)
    assert [COLUMN_RULE.get(c) for c in columns] == list(COLUMN_RULE.values()), columns
    assert sorted(table) == sorted(METHOD_ARM), sorted(table)
    stem = TABLES[heading]
    df = load_rows([ROWS / f"{stem}_screen.csv", ROWS / f"{stem}_rows.csv"])
    result = compare(df).set_index(["rule", "arm"])
    for method, cells in table.items():
        for column, cell in zip(columns, cells, strict=True):
            row = result.loc[(COLUMN_RULE[column], METHOD_ARM[method])]
            assert row["n_rows"] == 3, (method, column, row["row_seeds"])
            assert re.sub(r"\s+", " ", cell) == _cell(row), (method, column)
