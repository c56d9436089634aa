"""The comparison of a tuning sweep (unbiased/search.py's arms, sweeps/tuning.py's draws): the
same selection rules for every arm, each labelled with what it reads.

A rule does two things with the rows of one arm on the screening seeds: in each trial it
picks an epoch (where it does: the validation rules and the oracle read every epoch; the
paper's lowest-MI rule reads the epoch the trial's own label-free stopping rule reported),
then among the arm's draws it picks one. The arm's row under the rule is that draw on the
other seeds (the rows: the screen's seed is not among them), each trial at the epoch the rule
picks in it. The rules (`RULES`): the paper's lowest MI among draws that fit the training data
and whose fresh estimate did not fail; the field's training-domain validation (DomainBed) and
its worst group (Sagawa et al.'s, SubpopBench's); the oracle, an upper bound.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.cells import stat
from analysis.io import atomic_write_parquet, atomic_write_text
from analysis.results import estimator_failed, excluded_mask
from unbiased.search import ARMS

# The columns each cell reports, where the rows have them (Biased MNIST adds biased_acc).
REPORTED = ("test_acc", "test_worst_acc", "biased_acc")
DATA_AXES = ("sigma", "rho")  # the group benchmarks' data axes


@dataclass(frozen=True)
class Rule:
    """A selection rule: `epoch_metric` chosen per trial (None: the trial's reported epoch),
    `draw_metric` compared across draws (higher is better unless `lowest`)."""

    key: str
    name: str
    reads: str
    epoch_metric: str | None
    draw_metric: str
    lowest: bool = False
    tie: str | None = None  # the column that breaks a tie of epoch_metric

    def epoch_row(self, trial: pd.DataFrame) -> pd.Series | None:
        """The row of one trial this rule reads (None: the trial lacks the rule's column)."""
        if self.epoch_metric is None:  # results.parquet marks it; an exported CSV names it
            if "selected" in trial.columns:
                chosen = trial[trial["selected"].astype(bool)]
            else:
                chosen = trial[trial["epoch"] == trial["selected_epoch"].max()]
            return chosen.iloc[-1] if len(chosen) else trial.iloc[-1]
        if self.epoch_metric not in trial.columns or trial[self.epoch_metric].isna().all():
            return None
        order = [self.epoch_metric] + ([self.tie] if self.tie in trial.columns else [])
        ranked = trial.sort_values([*order, "epoch"], ascending=[False] * len(order) + [True],
                                   kind="stable")
        return ranked.iloc[0]


RULES: tuple[Rule, ...] = (
    Rule("lowest_mi", "lowest MI (the paper's, label-free)",
         "training rows: fit and a fresh estimate of I(z; c); the trial's own stopping rule "
         "picks the epoch", None, "mi_eval", lowest=True),
    Rule("val_acc", "validation accuracy",
         "held-out training rows (same bias): accuracy, per epoch", "val_acc", "val_acc"),
    Rule("val_worst", "validation worst-group accuracy",
         "held-out training rows with their groups: the worst group's accuracy, per epoch",
         "val_worst_acc", "val_worst_acc", tie="val_acc"),
    Rule("oracle", "oracle (peeks at test labels)",
         "test labels: accuracy, per epoch; an upper bound, not a result", "test_acc",
         "test_acc"),
)


class ComparisonError(ValueError):
    """The rows are not a tuning sweep's (no arm or draw column)."""


def load_rows(paths: Sequence[str | Path]) -> pd.DataFrame:
    """Per-epoch rows from results directories (results.parquet) or exported CSVs, in one
    frame; a row seen twice (the same trial and epoch) is kept once."""
    df = pd.concat([pd.read_parquet(path / "results.parquet") if path.is_dir()
                    else pd.read_csv(path) for path in map(Path, paths)], ignore_index=True)
    missing = [c for c in ("arm", "draw", "seed", "epoch") if c not in df.columns]
    if missing:
        raise ComparisonError(f"no column {', '.join(missing)}: not a tuning sweep's rows "
                              f"(the `tune` presets, --arms)")
    df = df[df["arm"].notna()].astype({"draw": int, "seed": int})
    keys = [c for c in ("benchmark", *DATA_AXES, "arm", "draw", "seed", "epoch")
            if c in df.columns]
    return df.drop_duplicates(keys, keep="last").reset_index(drop=True)


def _point_keys(df: pd.DataFrame) -> list[str]:
    return [c for c in ("benchmark", *DATA_AXES) if c in df.columns and df[c].notna().any()]


def _trials(df: pd.DataFrame) -> list[pd.DataFrame]:
    keys = [*_point_keys(df), "arm", "draw", "seed"]
    return [g.sort_values("epoch") for _, g in df.groupby(keys, sort=True, dropna=False)]


def _planned_epochs(last: pd.Series) -> int | None:
    """The epochs a trial was set to run: results.parquet's `epochs`, else (an exported CSV)
    its config's."""
    if "epochs" in last.index and pd.notna(last["epochs"]):
        return int(last["epochs"])
    try:
        epochs = json.loads(last["config"]).get("epochs")
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    return int(epochs) if isinstance(epochs, int | float) else None


def _kept(trial: pd.DataFrame) -> bool:
    """A trial that ran to its end and was not excluded (diverged, failed)."""
    last = trial.iloc[[-1]]
    planned = _planned_epochs(last.iloc[0])
    if planned is not None and int(last["epoch"].iloc[0]) < planned:
        return False
    return not bool(excluded_mask(last).iloc[0])


def picked_rows(df: pd.DataFrame, rule: Rule) -> pd.DataFrame:
    """Each finished, kept trial's row at the epoch `rule` picks in it (a trial without the
    rule's column is left out)."""
    rows = [row for trial in _trials(df)
            if _kept(trial) and (row := rule.epoch_row(trial)) is not None]
    return pd.DataFrame(rows).reset_index(drop=True)


def choose_draw(rows: pd.DataFrame, rule: Rule, tolerance: float) -> tuple[int, str] | None:
    """The draw `rule` picks among one arm's screen rows (the mean over screen seeds per
    draw), with the reason; None when no draw can be chosen."""
    if rule.draw_metric not in rows.columns or rows.empty:
        return None
    tie = rule.tie if rule.tie in rows.columns else rule.draw_metric
    per_draw = rows.groupby("draw").agg(value=(rule.draw_metric, "mean"),
                                        tie=(tie, "mean"), train_acc=("train_acc", "mean"))
    per_draw = per_draw[per_draw["value"].notna()]
    if rule.key == "lowest_mi":
        failed = rows.groupby("draw").apply(lambda g: bool(estimator_failed(g).any()),
                                            include_groups=False)
        per_draw = per_draw[~failed.reindex(per_draw.index, fill_value=False)]
        best_fit = per_draw["train_acc"].max()
        per_draw = per_draw[per_draw["train_acc"] >= best_fit - tolerance - 1e-12]
    if per_draw.empty:
        return None
    value = per_draw["value"].min() if rule.lowest else per_draw["value"].max()
    level = per_draw[np.isclose(per_draw["value"], value, rtol=0, atol=1e-12)]
    # A tie the rule's own column cannot break (Biased MNIST's validation worst group reads 0
    # in every trial: its rare groups hold a row or two) goes to the tie column, as per epoch.
    draw = int(level["tie"].fillna(-math.inf).idxmax())  # the first of equals: idxmax's
    word = "lowest" if rule.lowest else "highest"
    reason = f"{word} {rule.draw_metric} {value:.4f} of {len(per_draw)} draws"
    if len(level) > 1:
        reason += f", {len(level)} of them level: " + (
            f"{tie} {level.loc[draw, 'tie']:.4f} breaks the tie" if tie != rule.draw_metric
            else "the first")
    if rule.key == "lowest_mi":
        reason += f" fitting within {tolerance:g} of the best train acc {best_fit:.3f}"
    return draw, reason


def compare(df: pd.DataFrame, screen_seeds: Sequence[int] = (0,), tolerance: float = 0.05
            ) -> pd.DataFrame:
    """One row per (data point, rule, arm): the draw the rule picks on the screen seeds, and
    on every other seed its trials' means, stds and count at the rule's epochs."""
    screen_seeds = {int(s) for s in screen_seeds}
    points = _point_keys(df)
    out = []
    for rule in RULES:
        picked = picked_rows(df, rule)
        if picked.empty:
            continue
        for key, group in picked.groupby([*points, "arm"], sort=False, dropna=False):
            base = dict(zip([*points, "arm"], key, strict=True))
            screen = group[group["seed"].isin(screen_seeds)]
            choice = choose_draw(screen, rule, tolerance)
            row = {**base, "rule": rule.key, "rule_name": rule.name, "reads": rule.reads,
                   "draw": math.nan, "reason": "no draw to choose from on the screen seeds",
                   "settings": ""}
            if choice is not None:
                draw, reason = choice
                chosen = group[group["draw"] == draw]
                on_screen = chosen[chosen["seed"].isin(screen_seeds)]
                on_rows = chosen[~chosen["seed"].isin(screen_seeds)]
                row.update(draw=draw, reason=reason,
                           settings=_settings(screen, draw),
                           row_seeds=",".join(str(s) for s in sorted(on_rows["seed"])))
                for metric in (m for m in REPORTED if m in chosen.columns):
                    row[f"screen_{metric}"] = float(on_screen[metric].mean())
                    row[f"{metric}_mean"], row[f"{metric}_std"], row["n_rows"] = stat(
                        on_rows, metric)
            out.append(row)
    return pd.DataFrame(out)


# Config keys that differ between trials for other reasons than the draw.
_NOT_DRAWN = frozenset({"seed", "arm", "draw", "num_threads", "point"})


def _settings(rows: pd.DataFrame, draw: int) -> str:
    """The settings `draw` ran with among those the arm's draws vary (its drawn ones, read
    from the trials' config JSON): `lam 0.43, lr 0.00105, weight_decay 0.01`."""
    if "config" not in rows.columns or rows.empty:
        return ""
    configs = {int(d): json.loads(c) for d, c in zip(rows["draw"], rows["config"], strict=True)}
    mine = configs.get(draw, {})
    varying = sorted(k for k in mine if k not in _NOT_DRAWN
                     and len({json.dumps(c.get(k)) for c in configs.values()}) > 1)
    return ", ".join(f"{k} {mine[k]:g}" if isinstance(mine[k], int | float)
                     else f"{k} {mine[k]}" for k in varying)


def _cell(row: pd.Series, metric: str) -> str:
    mean, std, n = row.get(f"{metric}_mean"), row.get(f"{metric}_std"), row.get("n_rows")
    if mean is None or not np.isfinite(mean):
        return "not run"
    text = f"{mean:.3f}"
    if std is not None and np.isfinite(std):
        text += f" ± {std:.3f}"
    return text + (f" ({int(n)})" if n else "")


def comparison_markdown(table: pd.DataFrame, labels: dict[str, str] | None = None,
                        command: str = "", row_seeds: str = "1,2,3") -> str:
    """One block per data point and rule, a row per arm. Where picks' rows have not run, the
    command that runs them closes the data point."""
    labels = labels or {}
    points = [c for c in ("benchmark", *DATA_AXES) if c in table.columns]
    metrics = [m for m in REPORTED if f"{m}_mean" in table.columns]
    lines = ["# The comparison: every arm, the same draws, the same rules", "",
             "Each rule picks an arm's draw on the screen seed; the arm's row is that draw "
             "on the other seeds, mean ± std (seeds), each trial at the epoch the rule picks "
             "in it. `screen`: the pick's value on the screen seed, which chose it."]
    for key, block in table.groupby(points, sort=False, dropna=False):
        where = ", ".join(f"{k} {v}" for k, v in zip(points, key, strict=True))
        missing: dict[str, set[int]] = {}
        for _, rows in block.groupby("rule", sort=False):
            first = rows.iloc[0]
            lines += ["", f"## {where}: {first['rule_name']}", "",
                      f"Reads: {first['reads']}.", ""]
            head = ["arm", "draw", "settings", *[f"screen {m}" for m in metrics],
                    *[f"{m} (rows)" for m in metrics]]
            lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
            for _, row in rows.iterrows():
                drawn = np.isfinite(row["draw"])
                screen = [f"{row[f'screen_{m}']:.3f}" if np.isfinite(
                    row.get(f"screen_{m}", math.nan)) else "-" for m in metrics]
                cells = [_cell(row, m) for m in metrics]
                lines.append("| " + " | ".join([
                    labels.get(row["arm"], row["arm"]),
                    str(int(row["draw"])) if drawn else "-", row["settings"] or "-",
                    *screen, *cells]) + " |")
                if drawn and "not run" in cells:
                    missing.setdefault(row["arm"], set()).add(int(row["draw"]))
        if missing:
            flags = " ".join(f"--draw-of {arm}={','.join(map(str, sorted(draws)))}"
                             for arm, draws in missing.items())
            lines += ["", f"Rows not run yet at {where}: `{command} --seeds {row_seeds} "
                          f"--arms {','.join(missing)} {flags}`".replace("  ", " ")]
    return "\n".join(lines) + "\n"


def rows_flags(table: pd.DataFrame) -> str:
    """The flags that run every rule's pick of every arm (`--arms A,B --draw-of A=I,J ...`)."""
    picks: dict[str, set[int]] = {}
    for arm, draw in zip(table["arm"], table["draw"], strict=True):
        if np.isfinite(draw):
            picks.setdefault(str(arm), set()).add(int(draw))
    return " ".join([f"--arms {','.join(picks)}", *(
        f"--draw-of {arm}={','.join(map(str, sorted(draws)))}" for arm, draws in picks.items())])


def write_comparison(df: pd.DataFrame, out: Path, screen_seeds: Sequence[int] = (0,),
                     tolerance: float = 0.05, command: str = "") -> list[Path]:
    """OUT/comparison.md and comparison.parquet of a tuning sweep's rows (atomically)."""
    rows = df[df["arm"].notna()].astype({"draw": int})
    table = compare(rows, screen_seeds, tolerance)
    if table.empty:
        return []
    labels = {name: arm.label for name, arm in ARMS.items()}
    others = sorted(set(rows["seed"]) - set(screen_seeds))
    row_seeds = ",".join(map(str, others or range(max(screen_seeds) + 1, max(screen_seeds) + 4)))
    text = comparison_markdown(table, labels, command or _sweep_command(out), row_seeds)
    return [atomic_write_text(out / "comparison.md", text),
            atomic_write_parquet(table, out / "comparison.parquet")]


def _sweep_command(out: Path) -> str:
    """The sweep's command from OUT/experiment.json, without the flags the rows replace."""
    try:
        words = json.loads((out / "experiment.json").read_text()).get("command", "").split()
    except (OSError, ValueError, AttributeError):
        return ""
    kept, rest = [], iter(words)
    for word in rest:
        if word in ("--seeds", "--draw-of", "--arms", "--out"):
            next(rest, None)  # the flag's value
        elif word not in ("--resume", "--overwrite"):
            kept.append(word)
    if kept and kept[0].endswith("sweeps/__main__.py"):
        kept[0] = "-m sweeps"
    return " ".join(["python", *kept, "--out", f"{out}_rows"]) if kept else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m analysis.comparison",
        description="The comparison of a tuning sweep's screen and rows (results directories "
                    "or exported CSVs, in any number): each rule's pick per arm on the "
                    "screen seeds, and its rows on the others.")
    parser.add_argument("paths", nargs="+", type=Path, metavar="DIR_OR_CSV")
    parser.add_argument("--screen-seeds", default="0",
                        help="the seeds the rules pick on, comma-separated (default 0)")
    parser.add_argument("--tolerance", type=float, default=0.05,
                        help="train-accuracy tolerance of the lowest-MI rule (default 0.05)")
    parser.add_argument("--command", default="",
                        help="the sweep command the 'rows not run' lines start with")
    parser.add_argument("--out", type=Path,
                        help="directory for comparison.md and comparison.parquet")
    parser.add_argument("--rows-flags", action="store_true",
                        help="print only the sweep flags that run every pick's rows "
                             "(--arms, --draw-of) and write nothing")
    args = parser.parse_args(argv)
    if args.out is None and not args.rows_flags:
        parser.error("the following arguments are required: --out (or --rows-flags)")
    try:
        screen = [int(s) for s in args.screen_seeds.split(",")]
        rows = load_rows(args.paths)
        if args.rows_flags:
            print(rows_flags(compare(rows, screen, args.tolerance)))
            return 0
        written = write_comparison(rows, args.out, screen, args.tolerance, args.command)
    except (ComparisonError, OSError, ValueError) as exc:
        print(f"error: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}",
              file=sys.stderr)
        return 2
    for path in written:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
