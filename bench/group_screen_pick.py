"""The label-free picks of the Group DRO and balanced-MI screens (bench/group_screen.sh),
across sweeps.

Group DRO's screen is one sweep per (eta, weight decay): table.md's rules pick a lambda
within a sweep, so the choice among the variants is made here, by the same rules, each
variant (and ERM, the balanced screen's lambda 0) a candidate as a lambda would be. Prints
one markdown table per benchmark: each candidate's reported epoch, train and test accuracy,
balanced mi_eval / mi_eval_cond, and the rules' picks (their reasons number the
candidates as λ 0, 1, ... in the table's order).

With --rows, the same rules pick per (data axis value, seed) among the three-seed rows of
several settings (exported epochs CSVs, NAME=CSV each), one trial of each a candidate; the
picked trials' test accuracy is then averaged per axis value: the rules applied point by point.

    python bench/group_screen_pick.py runs/group_screen            # or its exported CSVs:
    python bench/group_screen_pick.py bench/results/group_screen_68
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
from sweeps.results_frame import selected_rows  # noqa: E402

COLUMNS = ("epoch", "train_acc", "test_acc", "mi_eval", "mi_eval_cond")


def screen_sweeps(root: Path, bench: str) -> dict[str, Path]:
    """Each candidate sweep of one benchmark's screens, by name: under an OUT directory
    (`BENCH/balanced_screen/results.parquet`, `BENCH/dro_eta*/results.parquet`) or, in a folder
    of exported CSVs (bench/results/group_screen_68), `BENCH_balanced_screen.csv` and
    `BENCH_dro_eta*.csv`."""
    if (root / bench).is_dir():
        balanced = root / bench / "balanced_screen" / "results.parquet"
        dro = {p.parent.name[4:]: p for p in root.glob(f"{bench}/dro_eta*/results.parquet")}
    else:
        balanced = root / f"{bench}_balanced_screen.csv"
        dro = {p.stem[len(bench) + 5:]: p for p in root.glob(f"{bench}_dro_eta*.csv")}
    found = {"balanced": balanced, **dict(sorted(dro.items()))}
    return {name: path for name, path in found.items() if path.exists()}


def sweep_finals(path: Path) -> pd.DataFrame:
    return csv_finals(path) if path.suffix == ".csv" else final_rows(pd.read_parquet(path))


def candidates(root: Path, bench: str) -> pd.DataFrame:
    """One final row per candidate: ERM and mi_backprop's lambdas from balanced_screen, then
    each dro_* sweep's trial; `lam` numbers them for the rules, `candidate` names them."""
    rows = []
    for name, path in screen_sweeps(root, bench).items():
        finals = sweep_finals(path).sort_values("lam")
        for row in finals.to_dict("records"):
            if name == "balanced":
                label = "ERM" if row["lam"] == 0 else f"mi_backprop λ {row['lam']:g}"
            else:
                label = f"group_dro {name}"
            rows.append({**row, "candidate": label})
    table = pd.DataFrame(rows)
    table["lam"] = range(len(table))
    return table


def report(root: Path, bench: str) -> list[str]:
    table = candidates(root, bench)
    if table.empty:
        return [f"{bench}: no finished sweep yet"]
    lines = [f"### {bench}", "",
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
    """The final row of each whole trial of an exported epochs CSV: its `selected_epoch` (the
    label-free stopping rule's), as results.parquet marks it `selected`."""
    rows = pd.read_csv(path)
    last = rows.groupby("trial_id")["epoch"].transform("max")
    # A trial still running when exported is no candidate: it is short of its epochs, or, where
    # the CSV has no `epochs`, it has not reported its selected epoch yet.
    whole = (last >= rows["epochs"] if "epochs" in rows.columns else
             rows.groupby("trial_id")["selected_epoch"].transform("count") > 0)
    rows = rows[whole]
    return final_rows(rows.assign(selected=selected_rows(rows)))


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
              "argument) or a folder of its exported CSVs", file=sys.stderr)
        return 2
    root = Path(argv[0])
    benches = sorted({p.name for p in root.iterdir() if p.is_dir()}
                     | {p.name[:-len("_balanced_screen.csv")]
                        for p in root.glob("*_balanced_screen.csv")})
    for bench in benches:
        print("\n".join(report(root, bench)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
