"""The paper's tables from each trial's reported row, as markdown (`table.md`) and a tidy frame
(`table.parquet`: benchmark, block, row, column, mean, std, n, source, rule, lam).

Every benchmark's paper table is `paper_table` on its spec (analysis.specs.TABLE_SPECS): the
spec says which columns, metrics and published rows a table has; the builder knows no
benchmark by name.

Every number is a trial's reported epoch (the row a label-free stopping rule picked, else its
last; `analysis.results.final_rows`), averaged over the kept (non-diverged) seeds of one
lambda; std is pandas' default sample std (ddof=1), NaN for a single seed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from analysis import published
from analysis.published import PublishedRow
from analysis.results import (
    LAM_ATOL,
    MI_METHOD,
    OK_WARNING,
    excluded_mask,
    group_keys,
    lam_label,
    per_lambda,
    selected_mask,
    sigma_label,
    spearman,
    with_lam,
)
from analysis.selection import (
    Choice,
    HighestFittingLambda,
    LowestMI,
    NoCandidateError,
    SelectionRule,
    default_rules,
    mi_column,
)
from analysis.specs import (
    BENCHMARK_METRICS,
    DATA_AXES,
    TABLE_SPECS,
    Column,
    ColumnAxis,
    TableSpec,
    axis_label,
    axis_value_label,
)

TIDY_COLUMNS = ["benchmark", "block", "row", "column", "mean", "std", "n", "source", "rule",
                "lam"]
DASH = "—"


@dataclass(frozen=True)
class Cell:
    """One number of a table. source is "ours" or "published"; rule says how the lambda
    of an "ours" cell was chosen ("fixed λ=…" or a selection rule's name); lam is the lambda
    the cell reports (NaN for published cells and baselines)."""

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
    """A markdown table: rows in order of first appearance, the given columns."""
    order: list[str] = []
    grid: dict[tuple[str, str], Cell] = {}
    for c in cells:
        if c.row not in order:
            order.append(c.row)
        grid[(c.row, c.column)] = c
    body = [[row] + [fmt_cell(grid[(row, col)]) if (row, col) in grid else DASH
                     for col in columns] for row in order]
    return md_table([corner, *columns], body)


PUBLISHED_SUFFIX = " (published)"


def partners(rows: Sequence[str]) -> dict[str, str]:
    """Each of our rows -> the published row of the same method (ERM, Alvi et al., Kim et
    al., Ours); our rows with no published counterpart (hsic, grad_reversal, ...) are left
    out."""
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
    same method (in the paper's order); our rows with no published counterpart come last.
    Stable within a group."""
    rows = list(dict.fromkeys(c.row for c in cells))
    pub = [r for r in rows if r.endswith(PUBLISHED_SUFFIX)]
    rank: dict[str, float] = {row: i + 0.5 for i, row in enumerate(pub)}
    rank.update({ours: pub.index(row) for ours, row in partners(rows).items()})
    first = {row: i for i, row in enumerate(rows)}
    order = sorted(rows, key=lambda r: (rank.get(r, len(pub)), first[r]))
    position = {row: i for i, row in enumerate(order)}
    return sorted(cells, key=lambda c: position[c.row])


def _same(series: pd.Series, value: float | str | None) -> pd.Series:
    if isinstance(value, str) or value is None:
        return series == value if value is not None else series.isna()
    return pd.Series(np.isclose(series.astype(float), float(value), rtol=0.0, atol=LAM_ATOL,
                                equal_nan=True), index=series.index)


def _kept(finals: pd.DataFrame) -> pd.DataFrame:
    return finals[~excluded_mask(finals)]


def _fixed_cell(bench: str, block: str, row: str, column: str, group: pd.DataFrame,
                lam: float, metric: str) -> Cell:
    mean, std, n = stat(with_lam(group, lam), metric)
    return Cell(bench, block, row, column, mean, std, n, "ours", f"fixed {lam_label(lam)}",
                lam)


def _chosen(rule: SelectionRule, group: pd.DataFrame) -> Choice | None:
    try:
        return rule.choose(group)
    except NoCandidateError:
        return None


def _rule_cell(bench: str, block: str, column: str, group: pd.DataFrame, rule: SelectionRule,
               metric: str, choice: Choice | None = None, label: str = "Ours") -> Cell:
    row = f"{label}, {rule.name}"
    choice = choice if choice is not None else _chosen(rule, group)
    if choice is None:
        return Cell(bench, block, row, column, math.nan, math.nan, 0, "ours", rule.name)
    mean, std, n = stat(with_lam(group, choice.lam), metric)
    return Cell(bench, block, row, column, mean, std, n, "ours", rule.name, choice.lam)


def _published_cell(bench: str, block: str, row: str, column: str,
                    value: tuple[float, float]) -> Cell:
    return Cell(bench, block, f"{row} (published)", column, value[0], value[1], None,
                "published", "")


def neural_methods(frame: pd.DataFrame) -> list[str]:
    """Methods with a lambda in `frame` (baselines such as the SVM have none): mi_backprop
    first, then the others by name, unknown names included."""
    names = set(frame.loc[frame["lam"].notna(), "method"].dropna().astype(str))
    return sorted(names, key=lambda m: (m != MI_METHOD, m))


def erm_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """The lam = 0 rows of `frame`: plain ERM whatever the method, so a sweep of several
    methods runs it once (under the first method) and every method's group shares it.
    mi_backprop's when it has any, else the first method's that has some."""
    zero = frame[np.isclose(frame["lam"].astype(float), 0.0, rtol=0.0, atol=LAM_ATOL)]
    for method in neural_methods(zero):
        rows = zero[zero["method"] == method]
        if len(rows):
            return rows
    return zero


def with_shared_erm(own: pd.DataFrame, frame: pd.DataFrame) -> pd.DataFrame:
    """`own` rows, plus the shared ERM rows of `frame` (lam = 0) when `own` has none."""
    if (np.isclose(own["lam"].astype(float), 0.0, rtol=0.0, atol=LAM_ATOL)).any():
        return own
    return pd.concat([own, erm_rows(frame)], ignore_index=True)


def method_group(frame: pd.DataFrame, method: str) -> pd.DataFrame:
    """One method's rows, plus the shared ERM rows (lam = 0) when it has none of its own."""
    return with_shared_erm(frame[frame["method"] == method], frame)


def _method_cells(bench: str, block: str, column: str, frame: pd.DataFrame,
                  methods: Sequence[str], rules: Sequence[SelectionRule], metric: str,
                  paper_lam: float) -> list[Cell]:
    """Per method: a row at its one lambda (a grid that gave it its own, --lam-of) or, when
    it ran several, at the paper's lambda; then a row per selection rule."""
    cells: list[Cell] = []
    for method in methods:
        group = method_group(frame, method)
        label = published.method_label(method)
        own = frame[frame["method"] == method]["lam"].astype(float)
        lams = sorted({float(v) for v in own if v > LAM_ATOL})
        if len(lams) == 1:
            cells.append(_fixed_cell(bench, block, f"{label} ({lam_label(lams[0])})", column,
                                     group, lams[0], metric))
        else:
            cells.append(_fixed_cell(bench, block, f"{label} ({lam_label(paper_lam)}, as "
                                     f"the paper)", column, group, paper_lam, metric))
        cells += [_rule_cell(bench, block, column, group, rule, metric, label=label)
                  for rule in rules]
    return cells


# --------------------------------------------------------------------------- paper tables


def _rows_of(frame: pd.DataFrame, where: Sequence[tuple[str, object]]) -> pd.DataFrame:
    """The rows of `frame` whose columns hold the given values (lambda-style tolerance)."""
    for key, value in where:
        frame = frame[_same(frame[key], value)]
    return frame


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


def paper_table(spec: TableSpec, finals: pd.DataFrame, rules: Sequence[SelectionRule]
                ) -> tuple[list[Cell], str]:
    """One benchmark's paper table from its spec: one block per K of mi_backprop, each with
    our rows of every method (a lambda-free baseline, ERM, the paper's lambda, each rule) and
    the published rows beside them."""
    bench = spec.benchmark
    rows = finals[finals["benchmark"] == bench]
    neural = rows[rows["lam"].notna()]
    baselines = [(label, _kept(rows[rows["method"] == method]))
                 for method, label in spec.baselines]
    if neural.empty and not any(len(b) for _, b in baselines):
        return [], ""
    for column in spec.requires:
        if column not in neural.columns:
            return [], (f"### {spec.table}\n\n{bench} rows have no `{column}` column: table "
                        f"skipped.\n")
    mi = neural[neural["method"] == MI_METHOD]
    others = [m for m in neural_methods(neural) if m != MI_METHOD]
    columns = table_columns(spec, neural)
    labels = [c.label for c in columns]
    note = spec.note.format(metric={c.label: c.metric[0] for c in columns})
    cells: list[Cell] = []
    parts: list[str] = []
    for K in sorted(mi["K"].unique()) or [None]:
        block = f"{spec.table} ({spec.measures})" + (f", K={K}" if K is not None else "")
        g = mi[mi["K"] == K] if K is not None else mi
        ours: list[Cell] = []
        for col in columns:
            metric = col.metric[0]
            gs, ns = _rows_of(g, col.where), _rows_of(neural, col.where)
            for label, base in baselines:
                base = _rows_of(base, col.where)
                if len(base):
                    mean, std, n = stat(base, metric)
                    ours.append(Cell(bench, block, label, col.label, mean, std, n, "ours",
                                     "baseline"))
            # a grid runs lam = 0 once, under its first K: every K's rows share it
            erm = with_shared_erm(gs, ns)
            ours.append(_fixed_cell(bench, block, spec.erm_row, col.label, erm, 0.0, metric))
            if len(gs):
                ours.append(_fixed_cell(bench, block, spec.paper_row, col.label, gs,
                                        col.paper_lam, metric))
                ours += [_rule_cell(bench, block, col.label, erm, rule, metric)
                         for rule in rules]
            ours += _method_cells(bench, block, col.label, ns, others, rules, metric,
                                  col.paper_lam)
        paper = [_published_cell(bench, block, p.row, col.label, value)
                 for p in spec.published for col in columns
                 if (value := published_value(spec, p, col)) is not None]
        block_cells = paired(ours + paper)
        cells += block_cells
        # A benchmark may come with no published numbers (a new one): its table says so.
        unpublished = "" if spec.published else "No published rows for this table.\n\n"
        parts.append(f"### {block}\n\n" + (f"{note}\n\n" if note else "") + unpublished
                     + render_block(block_cells, labels, spec.corner))
    return cells, "\n".join(parts)


# ------------------------------------------------------------------- gap to the paper


class _Fields(dict):
    """experiment.json's values for a note; a setting an older record lacks reads "?"."""

    def __missing__(self, key: str) -> str:
        return "?"


def off_protocol(spec: TableSpec, experiment: dict | None) -> str:
    """'' where our cells may be set against the published rows in std units; else the line
    that says what the runs are instead (a preset whose protocol is not the published
    rows'). Results without a recorded preset are compared: nothing says otherwise."""
    record = experiment or {}
    preset = record.get("preset")
    if spec.protocol is None or not isinstance(preset, str):
        return ""
    values = record.get("values")
    values = values if isinstance(values, dict) else {}
    protocol = spec.protocol
    if preset in protocol.comparable and all(
            values.get(key, value) == value for key, value in protocol.settings.items()):
        return ""
    rows = protocol.rows.get(str(values.get("source")))
    fields = _Fields({**values, "preset": preset,
                      "train_rows": f"{rows:,}" if rows is not None else "?"})
    return protocol.notes.get(preset, protocol.other).format_map(fields) + "\n"

GAP_STDS = 2.0  # a gap is flagged when it exceeds this many stds


def gap_section(cells: Sequence[Cell]) -> str:
    """Per block: each of our fixed-lambda rows (ERM, the paper's lambda, each competitor)
    minus its published row, per column, in units of the larger of the two rows' stds (ours
    over seeds, the paper's as printed; a row with no std, such as the paper's competitors,
    leaves the other's). Rule rows are left out: their lambda changes with the data."""
    by_block: dict[str, list[Cell]] = {}
    for c in cells:
        by_block.setdefault(c.block, []).append(c)
    parts: list[str] = []
    for block, block_cells in by_block.items():
        grid = {(c.row, c.column): c for c in block_cells}
        columns = list(dict.fromkeys(c.column for c in block_cells))
        rows = list(dict.fromkeys(c.row for c in block_cells))
        body: list[list[str]] = []
        flagged = compared = 0
        for ours, pub in partners(rows).items():
            if not any(grid[k].rule.startswith("fixed") for k in grid if k[0] == ours):
                continue
            line = [ours]
            for col in columns:
                mine, theirs = grid.get((ours, col)), grid.get((pub, col))
                if mine is None or theirs is None or not mine.n or not (
                        np.isfinite(mine.mean) and np.isfinite(theirs.mean)):
                    line.append(DASH)
                    continue
                gap = mine.mean - theirs.mean
                stds = [s for s in (mine.std, theirs.std) if np.isfinite(s) and s > 0]
                compared += 1
                if not stds:
                    line.append(f"{gap:+.3f} (no std)")
                    continue
                units = gap / max(stds)
                over = abs(units) > GAP_STDS
                flagged += over
                line.append(f"{gap:+.3f} ({units:+.1f} std){' **>2**' if over else ''}")
            body.append(line)
        if body:
            parts.append(
                f"### {block}: ours − published\n\nIn brackets: the gap over the larger of "
                f"the two rows' stds (ours over seeds, the paper's as printed). "
                f"{flagged} of {compared} cells differ by more than {GAP_STDS:g} std.\n\n"
                + md_table(["Row (ours)", *columns], body))
    return "\n".join(parts)


# --------------------------------------------------------------- per-group lambda sections


def _sub_label(key: dict[str, object]) -> str:
    parts = []
    if key.get("method") != MI_METHOD:
        parts.append(str(key.get("method")))
    for axis in ("sigma", *(a for a in DATA_AXES if a != "sigma")):
        label = axis_value_label(axis, key.get(axis))
        if label is not None:
            parts.append(label)
    return ", ".join(parts) or "all"


def _groups(finals: pd.DataFrame, bench: str, K: int) -> list[tuple[str, pd.DataFrame]]:
    """The selection groups of one (benchmark, K); a group without lam = 0 trials gets the
    shared ERM rows of its sigma / train split (run once under another method)."""
    neural = finals[(finals["benchmark"] == bench) & finals["lam"].notna()]
    g = neural[neural["K"] == K]
    keys = [k for k in group_keys(g) if k not in ("benchmark", "K")]
    data_keys = [k for k in keys if k != "method"]
    out = []
    for values, sub in g.groupby(keys, dropna=False, sort=True):
        key = dict(zip(keys, values if isinstance(values, tuple) else (values,), strict=True))
        same = neural
        for k in data_keys:
            same = same[_same(same[k], key[k])]
        sub = with_shared_erm(sub, same)
        out.append((_sub_label(key), sub))
    return out


def lambda_sections(finals: pd.DataFrame, bench: str, rules: Sequence[SelectionRule]
                    ) -> tuple[list[Cell], str]:
    """Per (K, group): final metrics per lambda, each rule's choice with its gap to the
    oracle, and the Spearman correlation between final MI and test accuracy."""
    cells: list[Cell] = []
    parts: list[str] = []
    b = finals[(finals["benchmark"] == bench) & finals["lam"].notna()]
    extra = [m for m in ("mi_eval_cond", *BENCHMARK_METRICS)
             if m in b.columns and b[m].notna().any()]
    if "selected" in b.columns and "epoch" in b.columns:
        extra.append("epoch")  # the reported epoch (a stopping rule may pick an early one)
    metrics = ["test_acc", "train_acc", "mi", "mi_eval", *extra]
    names = {"test_acc": "test acc", "train_acc": "train acc", "mi": "MI (nats)",
             "mi_eval": "MI, fresh T (nats)", "mi_eval_cond": "MI beyond y, fresh T (nats)",
             "epoch": "epoch", "eo": "EO", "acc_eb1": "acc EB1",
             "acc_eb2": "acc EB2", "acc_test": "acc test"}
    oracle = next((r for r in rules if not r.label_free), None)
    for K in sorted(b["K"].unique()):
        groups = _groups(finals, bench, K)
        lam_rows, sel_rows, rho_rows = [], [], []
        k_text = f"K={K}" if K else "methods without K"
        block_l = f"per-λ final metrics, {k_text}"
        block_s = f"selection gap to oracle (test acc), {k_text}"
        block_r = f"Spearman ρ(MI, test acc), {k_text}"
        for label, g in groups:
            table = per_lambda(g)
            for r in table.itertuples(index=False):
                rd = r._asdict()
                row = f"{label}, {lam_label(r.lam)}"
                texts = []
                for m in metrics:
                    mean = rd.get(m, math.nan)
                    std, n = rd.get(f"{m}_std", math.nan), rd.get(f"{m}_n", 0)
                    cells.append(Cell(bench, block_l, row, m, mean, std, int(n), "ours",
                                      f"fixed {lam_label(r.lam)}", r.lam))
                    texts.append(DASH if not np.isfinite(mean) else
                                 f"{mean:.3f}" + (f" ± {std:.3f}" if np.isfinite(std) else ""))
                lam_rows.append([label, f"{r.lam:g}", *texts, str(r.n), str(r.n_excluded)])
            kept = table[table["n"] > 0]
            choices = {rule.name: _chosen(rule, g) for rule in rules}
            ref = choices.get(oracle.name) if oracle else None
            ref_acc = _lam_value(kept, ref.lam, "test_acc") if ref else math.nan
            for rule in rules:
                ch = choices[rule.name]
                if ch is None:
                    sel_rows.append([label, rule.name, DASH, DASH, DASH, DASH,
                                     "no non-diverged trial"])
                    continue
                acc = _lam_value(kept, ch.lam, "test_acc")
                gap = ref_acc - acc
                cells.append(Cell(bench, block_s, rule.name, label, gap, math.nan,
                                  None, "ours", rule.name, ch.lam))
                sel_rows.append([label, rule.name, f"{ch.lam:g}", fmt_num(acc),
                                 fmt_num(ref_acc), fmt_num(gap), ch.reason])
            col = mi_column(kept)
            rho = spearman(kept[col], kept["test_acc"]) if len(kept) else math.nan
            note = ""
            if len(kept) < 3:
                note = f"fewer than 3 lambdas ({len(kept)}): undefined"
            elif not np.isfinite(rho):
                note = "constant MI or accuracy: undefined"
            cells.append(Cell(bench, block_r, label, f"rho({col}, test_acc)", rho, math.nan,
                              len(kept), "ours", ""))
            rho_rows.append([label, str(len(kept)), col, fmt_num(rho), note])
        header = ["group", "λ", *[names.get(m, m) for m in metrics], "n", "excluded"]
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


def warnings_section(finals: pd.DataFrame) -> str:
    """Trials that ran to the end with a caveat (status "ok; ..."): kept, but read them with
    it (a runaway critic, no usable estimate for the stopping rule)."""
    if "status" not in finals.columns:
        return ""
    warned = finals[finals["status"].fillna("").astype(str).str.startswith(OK_WARNING)]
    if warned.empty:
        return ""
    rows = [[r.benchmark, str(r.trial_id), r.method, f"{r.lam:g}",
             sigma_label(r.sigma).removeprefix("σ="), str(r.K), str(r.seed), str(r.epoch),
             str(r.status).removeprefix(OK_WARNING)]
            for r in warned.sort_values(["benchmark", "K", "sigma", "lam", "seed"]).itertuples()]
    return ("## Trials with a warning (kept in means and selection)\n\n"
            + md_table(["benchmark", "trial_id", "method", "λ", "σ", "K", "seed",
                        "reported epoch", "warning"], rows) + "\n")


def wall_section(df: pd.DataFrame) -> str:
    """Wall time per trial of each (benchmark, method, lambda): the sum of its epochs'
    `epoch_s` (training, evaluation and checkpoint; `time_s`, training alone, where a row
    has no `epoch_s`), as measured with the sweep's trials side by side."""
    if df.empty or not ({"epoch_s", "time_s"} & set(df.columns)):
        return ""
    seconds = df["epoch_s"].astype(float) if "epoch_s" in df.columns else \
        pd.Series(math.nan, index=df.index)
    if "time_s" in df.columns:
        seconds = seconds.fillna(df["time_s"].astype(float))
    frame = df.assign(seconds=seconds, lam=df["lam"].astype(float).fillna(-1.0))
    per_trial = frame.groupby(["benchmark", "method", "lam", "trial_id"], dropna=False).agg(
        seconds=("seconds", "sum"), epochs=("epoch", "nunique"))
    rows = []
    for (bench, method, lam), g in per_trial.groupby(level=[0, 1, 2], sort=True):
        minutes = g["seconds"] / 60.0
        std = f" ± {minutes.std():.1f}" if len(g) > 1 else ""
        rows.append([bench, method, lam_label(lam) if lam >= 0 else DASH, str(len(g)),
                     f"{g['epochs'].mean():.1f}", f"{minutes.mean():.1f}{std}",
                     f"{(g['seconds'] / g['epochs']).mean() / 60.0:.2f}",
                     f"{minutes.sum() / 60.0:.2f}"])
    return ("## Wall time per trial\n\nThe sum of each trial's `epoch_s` (training, "
            "evaluation, checkpoint), as the sweep ran its trials side by side; mean ± std "
            "over trials.\n\n"
            + md_table(["benchmark", "method", "λ", "trials", "epochs", "min / trial",
                        "min / epoch", "hours in all"], rows) + "\n")


def excluded_section(finals: pd.DataFrame) -> str:
    bad = finals[excluded_mask(finals)]
    text = "## Diverged or failed trials (excluded from means and selection)\n\n"
    if bad.empty:
        return text + "None.\n"
    rows = [[r.benchmark, str(r.trial_id), r.method, f"{r.lam:g}",
             sigma_label(r.sigma).removeprefix("σ="), str(r.K), str(r.seed), str(r.epoch),
             str(getattr(r, "reason", "") or "excluded")]
            for r in bad.sort_values(["benchmark", "K", "sigma", "lam", "seed"]).itertuples()]
    return text + md_table(["benchmark", "trial_id", "method", "λ", "σ", "K", "seed",
                            "final epoch", "reason"], rows)


# ----------------------------------------------------------------------------- top level


def bias_section(bias: Sequence[dict]) -> str:
    """The data's bias strength (OUT/experiment.json's `bias_strength`, written by the digits
    drivers): per palette and stroke, the share of training digits the colour alone
    classifies at each sigma, mean over the sweep's seeds."""
    frame = pd.DataFrame(list(bias))
    if frame.empty or not {"sigma", "palette", "stroke", "colour_only_acc"} <= set(frame):
        return ""
    sigmas = sorted(frame["sigma"].astype(float).unique())
    rows = []
    for (palette, stroke), g in frame.groupby(["palette", "stroke"], sort=True):
        means = g.groupby("sigma")["colour_only_acc"].mean()
        rows.append([f"{palette}, {stroke}"] + [fmt_num(float(means[s])) if s in means.index
                                                 else "–" for s in sigmas])
    return ("### Bias strength\n\nThe training accuracy of the best classifier that sees "
            "only the binned colour c (the share of training digits colour alone "
            "classifies; 0.1 = no bias), mean over seeds.\n\n"
            + md_table(["palette, stroke"] + [sigma_label(s) for s in sigmas], rows))


def cell_source(df: pd.DataFrame) -> str:
    """Which epoch of a trial the cells are: the one a label-free stopping rule picked
    (`selected`, see `final_rows`) where the rows mark one, else the last."""
    if selected_mask(df).any():
        return ("each trial's reported epoch (the one its label-free stopping rule picked, "
                "column `epoch` below; its last epoch where the rule picked none)")
    return "each trial's final-epoch value"


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
            continue  # a benchmark with no rows is skipped
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
