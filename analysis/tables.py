"""The paper's tables from each trial's reported row, as markdown (`table.md`) and a tidy frame
(`table.parquet`); each benchmark's is `paper_table` on its spec."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict

import pandas as pd

from analysis.cells import TIDY_COLUMNS, Cell
from analysis.gaps import gap_section, off_protocol
from analysis.lambda_table import lambda_sections
from analysis.notes import (
    bias_section,
    cell_source,
    excluded_section,
    wall_section,
    warnings_section,
)
from analysis.paper_table import paper_table
from analysis.results import excluded_mask
from analysis.selection import HighestFittingLambda, LowestMI, SelectionRule, default_rules
from analysis.specs import TABLE_SPECS


def build_tables(df: pd.DataFrame, finals: pd.DataFrame,
                 rules: Sequence[SelectionRule] | None = None,
                 experiment: dict | None = None) -> tuple[pd.DataFrame, str]:
    """All tables for a validated results frame and its final rows: (tidy frame, markdown).
    `experiment`: the sweep's OUT/experiment.json, for facts about its data (bias strength)."""
    rules = tuple(rules) if rules is not None else default_rules()
    experiments = ", ".join(sorted(set(df["experiment"].dropna()))) or "(none)"
    tols = sorted({r.tolerance for r in rules if isinstance(r, LowestMI | HighestFittingLambda)})
    tol = ("label-free rules fit within a train-accuracy tolerance of "
           + ", ".join(f"{t:g}" for t in tols)) if tols else "no label-free rule"
    head = [
        f"# Results: {experiments}\n",
        f"{len(df)} rows, {df['trial_id'].nunique()} trials, "
        f"{int(excluded_mask(finals).sum()) if len(finals) else 0} excluded.\n",
        f"Cells: {cell_source(df)}, mean ± std over seeds (n = seeds with a value). std is "
        "pandas' default sample std (ddof=1); shown only for n ≥ 2. \"(published)\" rows are "
        "the paper's numbers. Rows named after a rule report the λ that rule chose (in the "
        f"cell). Selection: {tol} (absolute) of the best λ; ties → higher λ.\n",
    ]
    cells: list[Cell] = []
    body: list[str] = []
    for bench, spec in TABLE_SPECS.items():
        if not (finals["benchmark"] == bench).any():
            continue
        c1, md1 = paper_table(spec, finals, rules)
        c2, md2 = lambda_sections(finals, bench, rules)
        cells += c1 + c2
        # Gaps in std units to the published rows only where the runs follow their
        # protocol; a smoke run's table says what it is instead, above its numbers.
        instead = off_protocol(spec, experiment) if md1 else ""
        md_gap = "" if instead else gap_section(c1)
        md0 = bias_section((experiment or {}).get("bias_strength", [])) \
            if spec.bias_strength else ""
        body.append(f"## {bench}: {spec.title}\n\n"
                    + "\n".join(p for p in (instead, md1, md_gap, md0, md2) if p))
    if not body:
        body.append("No results rows.\n")
    markdown = ("\n".join(head) + "\n" + "\n".join(body) + "\n" + wall_section(df)
                + warnings_section(finals) + excluded_section(finals))
    tidy = pd.DataFrame([asdict(c) for c in cells], columns=TIDY_COLUMNS)
    tidy["n"] = tidy["n"].astype("Int64")
    tidy = tidy.astype({"mean": "float64", "std": "float64", "lam": "float64"})
    return tidy, markdown
