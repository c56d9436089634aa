"""The paper's Fig. 3 per method, a methods figure, a K-ablation figure, a trade-off figure
and a paper table whose columns are a data axis drawn against it, each with matplotlib's Agg
canvas (no pyplot, no display)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from analysis import groups
from analysis.cells import partners
from analysis.io import atomic_savefig
from analysis.results import MI_METHOD, excluded_mask, lam_label
from analysis.selection import LowestMI, SelectionRule
from analysis.specs import TABLE_SPECS, TRADE_OFFS, ColumnAxis, TableSpec, data_labels, present_axes

PANELS: tuple[tuple[str, str], ...] = (
    ("mi", "MI estimate (nats)"), ("test_acc", "test accuracy"), ("train_acc", "train accuracy"))
# Methods without an MI estimator of their own (mi is NaN) show their own penalty instead.
PENALTY_PANELS: tuple[tuple[str, str], ...] = (("penalty", "the method's penalty"),
                                               *PANELS[1:])


def _new_figure(width: float, height: float, rows: int, cols: int) -> tuple[Figure, np.ndarray]:
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots(rows, cols, squeeze=False)


def _style(ax, title: str, xlabel: str, ylabel: str | None = None, grid_axis: str = "both"
           ) -> None:
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel)
    if ylabel is not None:
        ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3, axis=grid_axis)


def _row_label(bench: str, key: tuple[object, ...], frame: pd.DataFrame) -> str:
    keys = present_axes(frame.columns)
    return ", ".join(data_labels(dict(zip(keys, key, strict=True)))) or bench


def _colors(lams: list[float]) -> dict[float, tuple[float, ...]]:
    from matplotlib import colormaps

    cmap = colormaps["tab10"] if len(lams) <= 10 else colormaps["viridis"]
    n = max(len(lams) - 1, 1)
    return {lam: cmap(i) if len(lams) <= 10 else cmap(i / n) for i, lam in enumerate(lams)}


def _subgroups(frame: pd.DataFrame) -> list[tuple[tuple[object, ...], pd.DataFrame]]:
    keys = present_axes(frame.columns)
    if not keys:
        return [((), frame)]
    return list(frame.groupby(keys, dropna=False, sort=True))


def _at_key(frame: pd.DataFrame, key: tuple[object, ...]) -> pd.DataFrame:
    """The rows of one subgroup (`_subgroups`' key), NaN matching NaN."""
    mask = pd.Series(True, index=frame.index)
    for col, value in zip(present_axes(frame.columns), key, strict=True):
        mask &= frame[col].isna() if pd.isna(value) else frame[col] == value
    return frame[mask]


def curves_figure(rows: pd.DataFrame, bench: str, K: int, method: str = MI_METHOD) -> Figure:
    """Fig. 3 for one (benchmark, method, K): a row per data point, a line per lambda (mean
    over seeds, shaded min-max). `rows` are the per-epoch rows of kept trials."""
    groups = _subgroups(rows)
    lams = sorted(set(rows["lam"].astype(float)))
    colors = _colors(lams)
    has_mi = np.isfinite(rows["mi"].to_numpy(dtype=float)).any()
    panels = PANELS if has_mi or "penalty" not in rows.columns else PENALTY_PANELS
    fig, axes = _new_figure(13.0, 3.1 * len(groups) + 0.6, len(groups), len(panels))
    for r, (key, sub) in enumerate(groups):
        for lam in lams:
            g = sub[np.isclose(sub["lam"], lam, rtol=0.0, atol=1e-9)]
            if g.empty:
                continue
            n_seeds = g["trial_id"].nunique()
            for c, (metric, _) in enumerate(panels):
                stats = g.groupby("epoch")[metric].agg(["mean", "min", "max"]).sort_index()
                ax = axes[r][c]
                ax.plot(stats.index, stats["mean"], color=colors[lam], lw=1.8,
                        marker="o" if len(stats) <= 12 else None, ms=3,
                        label=f"{lam_label(lam)} (n={n_seeds})")
                if n_seeds > 1:
                    ax.fill_between(stats.index, stats["min"], stats["max"], color=colors[lam],
                                    alpha=0.18, lw=0)
        label = _row_label(bench, key, rows)
        for c, (_, ylabel) in enumerate(panels):
            _style(axes[r][c], f"{label}: {ylabel}", "epoch", ylabel)
            axes[r][c].xaxis.set_major_locator(MaxNLocator(integer=True))
        axes[r][0].legend(title="λ (seeds)", fontsize=8, title_fontsize=8, loc="best")
    what = f"K={K}" if method == MI_METHOD else method
    fig.suptitle(f"{bench}, {what}: mean over seeds, shaded min–max", fontsize=12)
    return fig


METHOD_PANELS: tuple[tuple[str, str], ...] = (
    ("test_acc", "final test accuracy"), ("mi_eval", "final MI, fresh T (nats)"),
    ("train_acc", "final train accuracy"))


def methods_figure(finals: pd.DataFrame, bench: str, erm: pd.DataFrame) -> Figure:
    """One curve per method vs lambda (error bars: std over seeds), a row per data point; the
    shared ERM (lambda = 0) as a dashed line. `finals`: kept final rows, mi_backprop at one K."""
    lams = sorted(set(finals.loc[finals["lam"] > 0, "lam"].astype(float)))
    methods = sorted(set(finals["method"].astype(str)), key=lambda m: (m != MI_METHOD, m))
    colors = _colors([float(i) for i in range(len(methods))])
    groups = _subgroups(finals)
    fig, axes = _new_figure(13.0, 3.1 * len(groups) + 0.6, len(groups), len(METHOD_PANELS))
    x = {lam: i for i, lam in enumerate(lams)}
    for r, (key, sub) in enumerate(groups):
        base = _at_key(erm, key)
        for c, (metric, ylabel) in enumerate(METHOD_PANELS):
            ax = axes[r][c]
            for i, method in enumerate(methods):
                g = sub[(sub["method"] == method) & (sub["lam"] > 0)]
                if g.empty or metric not in g.columns:
                    continue
                stats = g.groupby("lam")[metric].agg(["mean", "std"]).sort_index()
                ax.errorbar([x[lam] for lam in stats.index], stats["mean"],
                            yerr=stats["std"].fillna(0.0), marker="o", capsize=3,
                            color=colors[float(i)], label=method)
            if metric in base.columns and base[metric].notna().any():
                ax.axhline(float(base[metric].mean()), ls="--", color="0.3", lw=1.2,
                           label=f"ERM (λ=0, n={base[metric].notna().sum()})")
            ax.set_xticks(list(x.values()), [f"{lam:g}" for lam in lams])
            _style(ax, f"{_row_label(bench, key, finals)}: {ylabel}", "λ")
        axes[r][0].legend(fontsize=8, loc="best")
    fig.suptitle(f"{bench}: methods side by side (mean ± std over seeds)", fontsize=12)
    return fig


def k_ablation_figure(finals: pd.DataFrame, bench: str) -> Figure:
    """Final test accuracy and final MI vs K; a row per lambda, a line per data point."""
    lams = sorted(set(finals["lam"].astype(float)))
    fig, axes = _new_figure(10.0, 3.0 * len(lams) + 0.6, len(lams), 2)
    groups = _subgroups(finals)
    colors = _colors([float(i) for i in range(len(groups))])
    for r, lam in enumerate(lams):
        at = finals[np.isclose(finals["lam"], lam, rtol=0.0, atol=1e-9)]
        for i, (key, _) in enumerate(groups):
            g = _at_key(at, key)
            if g.empty:
                continue
            for c, metric in enumerate(("test_acc", "mi")):
                stats = g.groupby("K")[metric].agg(["mean", "std"]).sort_index()
                axes[r][c].errorbar(stats.index, stats["mean"], yerr=stats["std"].fillna(0.0),
                                    marker="o", capsize=3, color=colors[float(i)],
                                    label=_row_label(bench, key, finals))
        for c, ylabel in enumerate(("final test accuracy", "final MI estimate (nats)")):
            _style(axes[r][c], f"{lam_label(lam)}: {ylabel} vs K", "K (MINE steps per update)",
                   ylabel)
        axes[r][0].legend(fontsize=8)
    fig.suptitle(f"{bench}: K ablation (mean ± std over seeds)", fontsize=12)
    return fig


def _bars_per_lambda(ax, finals: pd.DataFrame, metric: str, lams: list[float],
                     picked: list[bool]) -> None:
    """One bar per lambda (error bar: std over seeds, dots: single seeds); `picked` outlined."""
    colors = _colors(lams)
    for i, lam in enumerate(lams):
        vals = finals.loc[np.isclose(finals["lam"], lam, rtol=0.0, atol=1e-9), metric]
        vals = vals.dropna().astype(float)
        if vals.empty:
            continue
        std = float(vals.std(ddof=1)) if len(vals) > 1 else 0.0
        ax.bar(i, float(vals.mean()), yerr=std, capsize=4, color=colors[lam], alpha=0.8,
               edgecolor="black" if picked[i] else "none", lw=2.0 if picked[i] else 0.0)
        ax.plot(np.full(len(vals), i), vals.to_numpy(), "k.", ms=4, alpha=0.6)


def trade_off_figure(finals: pd.DataFrame, baselines: pd.DataFrame, bench: str, K: int,
                     rule: SelectionRule | None = None) -> Figure:
    """Final test accuracy and the benchmark's trade-off metric (German: EO) per lambda of one
    (benchmark, K); baselines as dashed lines; the lambda `rule` picks outlined, so its
    trade-off can be read off against the others."""
    rule = LowestMI() if rule is None else rule
    metric, label = TRADE_OFFS[bench]
    panels = (("test_acc", "test accuracy (higher is better)"), (metric, label))
    lams = sorted(set(finals["lam"].astype(float)))
    choice = groups.chosen(rule, finals)
    picked = [choice is not None and bool(np.isclose(lam, choice.lam, rtol=0.0, atol=1e-9))
              for lam in lams]
    fig, axes = _new_figure(10.0, 3.6, 1, len(panels))
    base_styles = ("--", ":", "-.")
    for ax, (metric, ylabel) in zip(axes[0], panels, strict=True):
        _bars_per_lambda(ax, finals, metric, lams, picked)
        for j, (method, g) in enumerate(baselines.groupby("method", sort=True)):
            vals = g[metric].dropna().astype(float)
            if not vals.empty:
                ax.axhline(float(vals.mean()), ls=base_styles[j % len(base_styles)], lw=1.5,
                           color="0.25", label=f"{method} (mean of {len(vals)})")
        ax.set_xticks(np.arange(len(lams)), [f"{lam:g}" + (" *" if p else "")
                                             for lam, p in zip(lams, picked, strict=True)])
        _style(ax, ylabel, f"λ (* = {rule.name} choice, outlined)", ylabel, grid_axis="y")
        if metric == "test_acc":  # accuracies differ by points: zoom in rather than start at 0
            shown = pd.concat([finals[metric], baselines[metric]]).dropna().astype(float)
            if not shown.empty:
                ax.set_ylim(max(0.0, float(shown.min()) - 0.1), min(1.0, float(shown.max()) + 0.05))
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8, loc="best")
    n_seeds = finals.groupby("lam")["trial_id"].nunique()
    lo, hi = int(n_seeds.min()), int(n_seeds.max())
    fig.suptitle(f"{bench}, K={K}: final test accuracy and {label} per λ "
                 f"(mean ± std over {lo if lo == hi else f'{lo}-{hi}'} seeds)", fontsize=11)
    return fig


def _axis_value(column: str) -> float:
    """The data-axis value of a column label ("σ=0.020")."""
    return float(column.split("=", 1)[1])


def table_figure(tidy: pd.DataFrame, spec: TableSpec) -> Figure | None:
    """A paper table whose columns are a data axis (Table 1: sigma): the measure vs the axis,
    a panel per block, a line per fixed-lambda row of ours and each published row as crosses
    in its partner's colour. None when there is no such table to draw."""
    axis = spec.columns
    if not isinstance(axis, ColumnAxis):
        return None
    d = tidy[(tidy["benchmark"] == spec.benchmark) & tidy["block"].str.startswith(spec.table)]
    d = d[(d["source"] == "published") | d["rule"].str.startswith("fixed")]
    if d.empty:
        return None
    blocks = list(dict.fromkeys(d["block"]))
    fig, axes = _new_figure(7.5 * len(blocks), 5.0, 1, len(blocks))
    for ax, block in zip(axes[0], blocks, strict=True):
        cells = d[d["block"] == block]
        rows = list(dict.fromkeys(cells["row"]))
        partner = partners(rows)
        ours = [r for r in rows if not r.endswith(" (published)")]
        pub = [r for r in rows if r.endswith(" (published)")]
        lone = [r for r in pub if r not in partner.values()]
        colors = _colors([float(i) for i in range(len(ours) + len(lone))])
        color = {row: colors[float(i)] for i, row in enumerate(ours + lone)}
        for mine, theirs in partner.items():
            color.setdefault(theirs, color[mine])
        for row in ours + pub:
            r = cells[(cells["row"] == row) & cells["mean"].notna()]
            r = r.assign(x=r["column"].map(_axis_value)).sort_values("x")
            if r.empty:
                continue
            if row in pub:
                ax.plot(r["x"], r["mean"], ls=":", marker="x", ms=7, color=color[row],
                        label=row)
            else:
                ax.errorbar(r["x"], r["mean"], yerr=r["std"].fillna(0.0), marker="o",
                            capsize=3, lw=1.8, color=color[row],
                            label=f"{row} (n={int(r['n'].max())})")
        _style(ax, block, f"{axis.symbol} ({axis.key})", spec.measures)
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(f"{spec.name}: ours (mean ± std over seeds) beside the published rows (×)",
                 fontsize=11)
    return fig


def write_table_figures(tidy: pd.DataFrame, out_dir: str | Path) -> list[Path]:
    """figures/<benchmark>_<table>.png (Table 1: digits_table1.png) from the tidy table."""
    written = []
    for bench, spec in TABLE_SPECS.items():
        fig = table_figure(tidy, spec)
        if fig is not None:
            name = f"{bench}_{''.join(ch for ch in spec.table.lower() if ch.isalnum())}.png"
            written.append(atomic_savefig(fig, Path(out_dir) / name))
    return written


def write_figures(df: pd.DataFrame, finals: pd.DataFrame, out_dir: str | Path,
                  rule: SelectionRule | None = None) -> list[Path]:
    """Every figure of the final rows into `out_dir`; the trade-off figure marks `rule`'s
    choice (the tables' lowest-MI rule, so both agree)."""
    out = Path(out_dir)
    kept_all = finals[~excluded_mask(finals)]
    neural = kept_all[kept_all["lam"].notna()]
    kept_finals = neural[neural["method"] == MI_METHOD]
    written: list[Path] = []
    for bench in sorted(set(neural["benchmark"])):
        nb = neural[neural["benchmark"] == bench]
        for method in sorted(set(nb["method"].astype(str))):
            mb = nb[nb["method"] == method]
            rows = df[df["trial_id"].isin(set(mb["trial_id"]))]
            if method == MI_METHOD:
                for K in sorted(rows["K"].unique()):
                    fig = curves_figure(rows[rows["K"] == K], bench, int(K))
                    written.append(atomic_savefig(fig, out / f"{bench}_K{int(K)}_curves.png"))
            else:
                fig = curves_figure(rows, bench, 0, method)
                written.append(atomic_savefig(fig, out / f"{bench}_{method}_curves.png"))
        if nb["method"].nunique() > 1:
            # mi_backprop at its most common K, beside every other method
            mi = nb[nb["method"] == MI_METHOD]
            K = mi["K"].mode().iloc[0] if len(mi) else None
            side = nb[(nb["method"] != MI_METHOD) | (nb["K"] == K)]
            zero = np.isclose(side["lam"].astype(float), 0.0, rtol=0.0, atol=1e-9)
            fig = methods_figure(side, bench, side[zero])
            written.append(atomic_savefig(fig, out / f"{bench}_methods.png"))
        bf = kept_finals[kept_finals["benchmark"] == bench]
        metric = TRADE_OFFS.get(bench, ("",))[0]
        if metric in bf.columns:
            baselines = kept_all[(kept_all["benchmark"] == bench) & kept_all["lam"].isna()]
            for K in sorted(bf["K"].unique()):
                at_K = bf[bf["K"] == K]
                if at_K[metric].notna().any():
                    fig = trade_off_figure(at_K, baselines, bench, int(K), rule)
                    written.append(atomic_savefig(fig, out / f"{bench}_K{int(K)}_{metric}.png"))
        if bf["K"].nunique() > 1:
            fig = k_ablation_figure(bf, bench)
            written.append(atomic_savefig(fig, out / f"{bench}_K_ablation.png"))
    return written
