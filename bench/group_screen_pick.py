"""The label-free picks of issue 68's screens (bench/group_screen.sh), across sweeps.

Group DRO's screen is one sweep per (eta, weight decay): table.md's rules pick a lambda
within a sweep, so the choice among the variants is made here, by the same rules, each
variant (and ERM, the balanced screen's lambda 0) a candidate as a lambda would be. Prints
one markdown table per benchmark: each candidate's reported epoch, train and test accuracy,
balanced mi_eval / mi_eval_cond, and the rules' picks (their reasons number the
candidates as λ 0, 1, ... in the table's order).

With --rows, the same rules pick per (data axis value, seed) among the three-seed rows of
several settings (exported epochs CSVs, NAME=CSV each), one trial of each a candidate; the
picked trials' test accuracy is then averaged per axis value: the rules applied point by point.

    python bench/group_screen_pick.py runs/group_screen
    python bench/group_screen_pick.py --rows "λ .3=a.csv" "λ 1=b.csv"
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analysis.results import final_rows  # noqa: E402
from analysis.selection import LowestMI, NoCandidateError, OracleTest  # noqa: E402
from analysis.specs import valued_axes  # noqa: E402

COLUMNS = ("epoch", "train_acc", "test_acc", "mi_eval", "mi_eval_cond")


def candidates(bench_dir: Path) -> pd.DataFrame:
    """One final row per candidate: ERM and mi_backprop's lambdas from balanced_screen, then
    each dro_* sweep's trial; `lam` numbers them for the rules, `candidate` names them."""
    rows = []
    balanced = bench_dir / "balanced_screen" / "results.parquet"
    if balanced.exists():
        finals = final_rows(pd.read_parquet(balanced))
        for row in finals.sort_values("lam").to_dict("records"):
            name = "ERM" if row["lam"] == 0 else f"mi_backprop λ {row['lam']:g}"
            rows.append({**row, "candidate": name})
    for sweep in sorted(bench_dir.glob("dro_*/results.parquet")):
        for row in final_rows(pd.read_parquet(sweep)).to_dict("records"):
            rows.append({**row, "candidate": f"group_dro {sweep.parent.name[4:]}"})
    table = pd.DataFrame(rows)
    table["lam"] = range(len(table))
    return table


def report(bench_dir: Path) -> list[str]:
    table = candidates(bench_dir)
    if table.empty:
        return [f"{bench_dir.name}: no finished sweep yet"]
    lines = [f"### {bench_dir.name}", "",
             "| candidate | " + " | ".join(COLUMNS) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
    for row in table.to_dict("records"):
        cells = [f"{row.get(c, float('nan')):.3f}" if c != "epoch"
                 else f"{row.get(c, float('nan')):.0f}" for c in COLUMNS]
        lines.append(f"| {row['candidate']} | " + " | ".join(cells) + " |")
    lines.append("")
    for rule in (LowestMI(), OracleTest()):
        for name, group in (("every candidate", table),
                            ("group_dro variants", table[table["candidate"].str.startswith(
                                "group_dro")]),
                            ("mi_backprop and ERM", table[~table["candidate"].str.startswith(
                                "group_dro")])):
            if group.empty:
                continue
            choice = rule.choose(group)
            picked = table.loc[table["lam"] == choice.lam, "candidate"].iloc[0]
            lines.append(f"- {rule.name}, among {name}: **{picked}** ({choice.reason})")
    return lines + [""]


def csv_finals(path: Path) -> pd.DataFrame:
    """The final row of each trial of an exported epochs CSV: its `selected_epoch` (the
    label-free stopping rule's), as results.parquet marks it `selected`."""
    rows = pd.read_csv(path)
    last = rows.groupby("trial_id")["epoch"].transform("max")
    chosen = rows.groupby("trial_id")["selected_epoch"].transform("max").fillna(last)
    return final_rows(rows.assign(selected=rows["epoch"].eq(chosen)))


def rows_report(settings: dict[str, Path]) -> list[str]:
    """Per (axis value, seed), each setting's trial a candidate: the rules' picks, then each
    rule's picked test accuracy per axis value over the seeds."""
    finals = [csv_finals(path).assign(candidate=name, lam=float(i))
              for i, (name, path) in enumerate(settings.items())]
    table = pd.concat(finals, ignore_index=True)
    axes = valued_axes(table)
    lines = ["| " + " | ".join(axes) + " | seed | " + " | ".join(
        f"{name}: test / train / mi_eval" for name in settings) + " | label-free | oracle |",
        "|---" * (len(axes) + len(settings) + 3) + "|"]
    picked: dict[tuple[str, tuple], list[float]] = {}
    for key, point in table.groupby(axes + ["seed"], sort=True):
        cells = []
        for name in settings:
            row = point[point["candidate"] == name]
            cells.append("—" if row.empty else (
                "{test_acc:.3f} / {train_acc:.3f} / {mi_eval:.3f}".format(**row.iloc[0])
                + (" (failed)" if row["estimator_failed"].iloc[0] else "")))
        picks = []
        for rule in (LowestMI(), OracleTest()):
            try:
                choice = rule.choose(point)
            except NoCandidateError:
                picks.append("none")
                continue
            row = point[point["lam"] == choice.lam].iloc[0]
            picks.append(f"{row['candidate']} ({row['test_acc']:.3f})")
            picked.setdefault((rule.name, key[:-1]), []).append(float(row["test_acc"]))
        lines.append("| " + " | ".join(f"{v:g}" for v in key) + " | " + " | ".join(cells)
                     + " | " + " | ".join(picks) + " |")
    lines.append("")
    for (rule_name, axis_value), tests in picked.items():
        values = pd.Series(tests)
        lines.append(f"- {rule_name}, {'/'.join(axes)} {'/'.join(f'{v:g}' for v in axis_value)}:"
                     f" {' / '.join(f'{t:.3f}' for t in tests)} (mean {values.mean():.3f}"
                     f" ± {values.std():.3f})")
    return lines


def main(argv: list[str]) -> int:
    if argv[:1] == ["--rows"]:
        settings = dict(item.split("=", 1) for item in argv[1:] if "=" in item)
        missing = [p for p in settings.values() if not Path(p).is_file()]
        if len(settings) < 2 or len(settings) != len(argv) - 1 or missing:
            print("error: --rows takes two or more NAME=CSV (exported epochs CSVs)"
                  + (f"; not a file: {missing[0]}" if missing else ""), file=sys.stderr)
            return 2
        print("\n".join(rows_report({k: Path(v) for k, v in settings.items()})))
        return 0
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print("error: give the screen's OUT directory (bench/group_screen.sh's second "
              "argument)", file=sys.stderr)
        return 2
    for bench_dir in sorted(p for p in Path(argv[0]).iterdir() if p.is_dir()):
        print("\n".join(report(bench_dir)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
