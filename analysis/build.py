"""Tables and figures for one results directory."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from analysis.ablations import ablation_axis, ablation_figure, ablation_section
from analysis.figures import write_figures, write_table_figures
from analysis.io import atomic_savefig, atomic_write_parquet, atomic_write_text
from analysis.latex import to_latex
from analysis.results import final_rows, load_results
from analysis.selection import LowestMI, SelectionRule
from analysis.tables import build_tables

EXPERIMENT_FILE = "experiment.json"  # written by sweeps/outputs.py beside results.parquet


def read_experiment(out: Path) -> dict:
    """OUT/experiment.json, or {} when absent or unreadable: the tables it adds to are optional."""
    try:
        record = json.loads((out / EXPERIMENT_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def build_all(results_dir: str | Path, rules: Sequence[SelectionRule] | None = None,
              figures: bool = True) -> list[Path]:
    """Read RESULTS_DIR/results.parquet; write table.md, table.parquet, table.tex and
    figures/*.png (atomically). Returns the written paths; prints nothing."""
    out = Path(results_dir)
    df = load_results(out)
    finals = final_rows(df)
    tidy, markdown = build_tables(df, finals, rules, read_experiment(out))
    axes = {bench: ablation_axis(df[df["benchmark"] == bench])
            for bench in sorted(set(df["benchmark"]))}
    sections = [ablation_section(df[df["benchmark"] == bench], axis, bench)
                for bench, axis in axes.items() if axis is not None]
    if sections:
        # An ablation's own table first; the Table blocks after it group trials by data point,
        # method, K and lambda only, so a critic ablation's four critics are pooled there.
        pooled = ("The Table blocks further down pool the four critics of each data point as if "
                  "they were seeds: read this section instead.\n\n"
                  if "critic" in axes.values() else "")
        title, rest = markdown.split("\n", 1)
        markdown = (title + "\n\n" + "\n".join(sections) + "\n" + pooled + rest.lstrip("\n"))
    written = [atomic_write_text(out / "table.md", markdown),
               atomic_write_parquet(tidy, out / "table.parquet"),
               atomic_write_text(out / "table.tex", to_latex(tidy))]
    if "arm" in df.columns and df["arm"].notna().any():  # a tuning sweep's comparison
        # imported here: `python -m analysis.comparison` runs it as a script
        from analysis.comparison import write_comparison

        written += write_comparison(df, out)
    if figures:
        # The figure marks the same lowest-MI choice as the tables (same tolerance).
        lowest = next((r for r in rules or () if r.key == LowestMI.key), None)
        written += write_figures(df, finals, out / "figures", lowest)
        written += write_table_figures(tidy, out / "figures")
        for bench, axis in axes.items():
            if axis is not None:
                fig = ablation_figure(df[df["benchmark"] == bench], axis, bench)
                written.append(atomic_savefig(fig, out / "figures" /
                                              f"{bench}_{axis}_ablation_curves.png"))
    return written
