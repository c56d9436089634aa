"""Ablations of mi_backprop at a fixed lambda: over K (digits' k_ablation_* presets, the paper's
supplementary) or over our two critic options (digits' critic_ablation_* presets). The figure
draws by epoch what the supplementary's K figure draws (training loss and accuracy), plus test
accuracy and the fresh MI estimate."""

from __future__ import annotations

import math

import pandas as pd
from matplotlib.figure import Figure

from analysis.cells import md_table
from analysis.figures import _colors, _new_figure, _style
from analysis.results import MI_METHOD, critic_warning
from analysis.specs import valued_axes

CRITIC_AXES = ("mine_standardize", "mi_guard")
# (standardize, guard) -> name, in the order the table lists them.
CRITICS: dict[tuple[bool, bool], str] = {
    (False, False): "paper's (neither)", (True, False): "standardised input",
    (False, True): "MI guard", (True, True): "both (ours)"}
CURVES: tuple[tuple[str, str], ...] = (
    ("loss_task", "training loss"), ("train_acc", "training accuracy"),
    ("test_acc", "test accuracy"), ("mi_eval", "MI, fresh critic (nats)"))


def _trained(df: pd.DataFrame) -> pd.DataFrame:
    """mi_backprop's trials at lam > 0 (ERM has no K or critic to ablate)."""
    lam = df["lam"].astype(float)
    return df[(df["method"] == MI_METHOD) & (lam > 0)]


def _flag(value: object) -> bool | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return str(value).strip().lower() in ("true", "1", "1.0")


def critic_of(rows: pd.DataFrame) -> pd.Series:
    """Each row's critic by name; None where a row does not record its options."""
    if not set(CRITIC_AXES) <= set(rows.columns):
        return pd.Series(None, index=rows.index, dtype=object)
    pairs = zip(rows[CRITIC_AXES[0]].map(_flag), rows[CRITIC_AXES[1]].map(_flag), strict=True)
    return pd.Series([CRITICS.get(p) for p in pairs], index=rows.index, dtype=object)


def ablation_axis(df: pd.DataFrame) -> str | None:
    """'critic' or 'K' when mi_backprop's trials differ in it, else None."""
    rows = _trained(df)
    if critic_of(rows).dropna().nunique() > 1:
        return "critic"
    if rows["K"].nunique() > 1:
        return "K"
    return None


def _axis_value(value: object) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def _values(rows: pd.DataFrame, axis: str) -> pd.Series:
    return critic_of(rows) if axis == "critic" else rows["K"].astype(int)


def _order(axis: str, values: set) -> list:
    return [v for v in CRITICS.values() if v in values] if axis == "critic" else sorted(values)


def _cell(values: pd.Series, digits: int = 3) -> str:
    v = values.dropna().astype(float)
    if v.empty:
        return "-"
    if len(v) == 1:
        return f"{v.iloc[0]:.{digits}f}"
    return f"{v.mean():.{digits}f} ± {v.std(ddof=1):.{digits}f}"


def per_trial(df: pd.DataFrame, axis: str) -> pd.DataFrame:
    """One row per trial: its grid point, the reported epoch's numbers, its best test acc."""
    rows = _trained(df).assign(value=lambda d: _values(d, axis))
    data_axes = valued_axes(rows)
    out = []
    for trial_id, trial in rows.groupby("trial_id"):
        trial = trial.sort_values("epoch")
        chosen = trial[trial["selected"].astype(bool)] if "selected" in trial else trial[-1:]
        chosen = chosen if len(chosen) else trial[-1:]
        row = chosen.iloc[-1]
        # The reported epoch's estimates made again with another seed where the rule ran.
        mi_eval = row.get("selected_mi_eval", math.nan)
        mi_cond = row.get("selected_mi_eval_cond", math.nan)
        if pd.isna(mi_eval):
            mi_eval, mi_cond = row.get("mi_eval", math.nan), row.get("mi_eval_cond", math.nan)
        seconds = trial["epoch_s"] if "epoch_s" in trial and trial["epoch_s"].notna().all() \
            else trial["time_s"]
        out.append({"trial_id": trial_id, **{a: row[a] for a in data_axes},
                    "value": row["value"], "lam": float(row["lam"]),
                    "seed": int(row["seed"]), "epoch": int(row["epoch"]),
                    "test_acc": float(row["test_acc"]), "train_acc": float(row["train_acc"]),
                    "best_test_acc": float(trial["test_acc"].max()),
                    "mi_eval": float(mi_eval), "mi_eval_cond": float(mi_cond),
                    "ran_away": bool(critic_warning(trial)),
                    "minutes": float(seconds.sum()) / 60.0,
                    "machine": row.get("machine") if pd.notna(row.get("machine"))
                    else row.get("node", "")})
    return pd.DataFrame(out)


def ablation_section(df: pd.DataFrame, axis: str, bench: str) -> str:
    trials = per_trial(df, axis)
    what = ("the critic (`--mine-standardize`, `--mi-guard`)" if axis == "critic"
            else "K, the MINE steps per model step")
    note = (f"{bench}: mi_backprop; mean ± std over seeds (one value: one seed). Test "
            "accuracy at each trial's reported epoch (its stopping rule's), beside its best "
            "over epochs, which peeks at test labels and is shown only to read the curves. "
            "mi_eval and mi_eval_cond: the reported epoch's, re-estimated with another seed. "
            "'Own critic ran away': trials whose own DV estimate fell below -5 nats. "
            "Minutes: a trial's wall time as it ran (two trials side by side on the machine "
            "that ran it).")
    data_axes = valued_axes(_trained(df))
    header = [*data_axes, "lambda", axis, "seeds", "test acc", "best test acc (peeks)",
              "train acc", "mi_eval", "mi_eval_cond", "own critic ran away", "minutes a trial",
              "machines"]
    rows = []
    for point, at in trials.groupby([*data_axes, "lam"]):
        *data, lam = point
        for value in _order(axis, set(at["value"])):
            g = at[at["value"] == value]
            rows.append([*map(_axis_value, data), f"{lam:g}", value,
                         ", ".join(str(s) for s in sorted(g["seed"])), _cell(g["test_acc"]),
                         _cell(g["best_test_acc"]), _cell(g["train_acc"]),
                         _cell(g["mi_eval"], 2), _cell(g["mi_eval_cond"], 2),
                         f"{int(g['ran_away'].sum())} of {len(g)}", _cell(g["minutes"], 1),
                         ", ".join(sorted(set(map(str, g["machine"]))))])
    return "\n".join([f"## Ablation over {what}", "", note, "", md_table(header, rows)])


def ablation_figure(df: pd.DataFrame, axis: str, bench: str) -> Figure:
    rows = _trained(df).assign(value=lambda d: _values(d, axis))
    data_axes = valued_axes(rows)
    panels = list(rows.groupby([*data_axes, "lam"], sort=True))
    values = _order(axis, set(rows["value"]))
    colors = _colors([float(i) for i in range(len(values))])
    fig, axes = _new_figure(4.0 * len(CURVES), 3.0 * len(panels) + 0.6, len(panels), len(CURVES))
    for r, ((*data, lam), at) in enumerate(panels):
        for i, value in enumerate(values):
            g = at[at["value"] == value]
            for c, (metric, _) in enumerate(CURVES):
                if metric not in g or g[metric].isna().all():
                    continue
                stats = g.groupby("epoch")[metric].agg(["mean", "min", "max", "count"])
                label = (f"K = {value}" if axis == "K" else str(value)) + \
                    f" (n={g['trial_id'].nunique()})"
                ax = axes[r][c]
                ax.plot(stats.index, stats["mean"], marker="o", ms=3, color=colors[float(i)],
                        label=label)
                ax.fill_between(stats.index, stats["min"], stats["max"], alpha=0.15,
                                color=colors[float(i)])
        for c, (_, title) in enumerate(CURVES):
            where = "".join(f"{a} {v:g}, " if isinstance(v, float) else f"{a} {v}, "
                            for a, v in zip(data_axes, data, strict=True))
            _style(axes[r][c], f"{where}lambda {lam:g}: {title}", "epoch")
        axes[r][0].legend(fontsize=8)
    fig.suptitle(f"{bench}: mi_backprop by {axis} (mean, shaded min-max over seeds)",
                 fontsize=12)
    return fig
