"""Figures: written by build_all as real, non-empty PNGs."""

from __future__ import annotations

import math
import struct
from pathlib import Path

import pandas as pd
import pytest

from analysis import build_all
from analysis.figures import table_figure, trade_off_figure
from analysis.io import atomic_write_parquet
from analysis.results import final_rows
from analysis.specs import TABLE_SPECS
from tests.synthetic import demo, frame, trial

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, path
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


@pytest.mark.slow
def test_build_all_writes_figures(tmp_path: Path) -> None:
    atomic_write_parquet(demo(), tmp_path / "results.parquet")
    written = build_all(tmp_path)
    figures = tmp_path / "figures"
    expected = {figures / name for name in (
        "digits_K20_curves.png", "digits_K80_curves.png", "digits_K_ablation.png",
        "digits_K_ablation_curves.png", "digits_table1.png", "german_K30_curves.png",
        "german_K30_eo.png", "imdb_K40_curves.png")}
    assert expected <= set(written)
    assert set(figures.iterdir()) == expected  # no temp files left
    for path in expected:
        width, height = png_size(path)
        assert path.stat().st_size > 10_000 and width > 500 and height > 300
    # one row per sigma (2 here) vs the single German row: the digits figure is taller
    assert png_size(figures / "digits_K80_curves.png")[1] > png_size(
        figures / "german_K30_curves.png")[1]


def test_single_K_has_no_ablation_and_diverged_only_lambda_is_fine(tmp_path: Path) -> None:
    rows = (trial(lam=0.0, mi=1.0, seed=0) + trial(lam=0.0, mi=1.1, seed=1)
            + trial(lam=1.0, mi=math.nan, status="diverged: nan loss"))
    atomic_write_parquet(frame(rows), tmp_path / "results.parquet")
    written = build_all(tmp_path)
    pngs = [p for p in written if p.suffix == ".png"]
    assert [p.name for p in pngs] == ["digits_K80_curves.png", "digits_table1.png"]
    png_size(pngs[0])


def test_trade_off_figure_marks_the_lowest_mi_choice_and_draws_the_svm() -> None:
    finals = final_rows(demo())
    german = finals[(finals["benchmark"] == "german") & ~finals["excluded"]]
    ours = german[german["method"] == "mi_backprop"]
    fig = trade_off_figure(ours, german[german["method"] == "svm"], "german", 30)
    acc_ax, eo_ax = fig.axes[:2]
    ticks = [t.get_text() for t in eo_ax.get_xticklabels()]
    # demo(): lam 1 has the lowest MI and still fits, so the rule picks it
    assert ticks == ["0", "0.5", "1 *"]
    bars = [p.get_height() for p in eo_ax.patches]
    expected = [ours.loc[ours["lam"] == lam, "eo"].mean() for lam in (0.0, 0.5, 1.0)]
    assert bars == [pytest.approx(v) for v in expected]
    svm_lines = [ln for ln in acc_ax.get_lines() if ln.get_label().startswith("svm")]
    assert len(svm_lines) == 1 and svm_lines[0].get_ydata()[0] == pytest.approx(0.74)


@pytest.mark.slow
def test_several_methods_get_a_curve_each_and_their_own_curves(tmp_path: Path) -> None:
    rows = []
    for seed in (0, 1):
        rows += trial(lam=0.0, seed=seed, test_acc=0.3, mi_eval=2.0)
        rows += trial(lam=1.0, seed=seed, test_acc=0.5, mi_eval=1.5)
        for method in ("hsic", "some_new_method"):
            rows += trial(method=method, lam=1.0, K=0, seed=seed, mi=math.nan,
                          test_acc=0.4, mi_eval=1.0, penalty=0.1)
            rows += trial(method=method, lam=3.0, K=0, seed=seed, mi=math.nan,
                          test_acc=0.45, mi_eval=0.8, penalty=0.05)
    atomic_write_parquet(frame(rows), tmp_path / "results.parquet")
    written = {p.name for p in build_all(tmp_path)}
    assert {"digits_K80_curves.png", "digits_hsic_curves.png",
            "digits_some_new_method_curves.png", "digits_methods.png"} <= written
    width, height = png_size(tmp_path / "figures" / "digits_methods.png")
    assert width > 500 and height > 300


@pytest.mark.slow
def test_table1_figure_draws_each_fixed_row_of_ours_beside_its_published_row(
        tmp_path: Path) -> None:
    rows = []
    for sigma in (0.02, 0.03):
        for seed in (0, 1):
            rows += trial(lam=0.0, seed=seed, sigma=sigma, test_acc=0.40 + seed / 10)
            rows += trial(lam=1.0, seed=seed, sigma=sigma, test_acc=0.80 + sigma)
            rows += trial(method="lntl", lam=0.01, K=0, seed=seed, sigma=sigma, mi=math.nan,
                          test_acc=0.70, penalty=0.1)
    atomic_write_parquet(frame(rows), tmp_path / "results.parquet")
    assert "digits_table1.png" in {p.name for p in build_all(tmp_path)}
    tidy = pd.read_parquet(tmp_path / "table.parquet")
    ax = table_figure(tidy, TABLE_SPECS["digits"]).axes[0]
    # ours: error bars at the seeds' mean and std, one per fixed-lambda row (no rule rows)
    ours = {c.get_label(): c for c in ax.containers}
    assert set(ours) == {"ERM (λ=0) (n=2)", "Ours (λ=1, as the paper) (n=2)",
                         "Kim et al. (ours) (λ=0.01) (n=2)"}
    erm_line = ours["ERM (λ=0) (n=2)"].lines[0]
    assert list(erm_line.get_xdata()) == [0.02, 0.03]
    assert list(erm_line.get_ydata()) == pytest.approx([0.45, 0.45])
    # published: crosses at the paper's values, in the colour of our row of the same method
    published = {ln.get_label(): ln for ln in ax.get_lines()
                 if ln.get_label().endswith("(published)")}
    assert list(published["ERM (λ=0) (published)"].get_ydata()) == [0.476, 0.664]
    assert published["Kim et al. (published)"].get_marker() == "x"
    for mine, theirs in (("ERM (λ=0) (n=2)", "ERM (λ=0) (published)"),
                         ("Kim et al. (ours) (λ=0.01) (n=2)", "Kim et al. (published)"),
                         ("Ours (λ=1, as the paper) (n=2)", "Ours (λ=1) (published)")):
        assert ours[mine].lines[0].get_color() == published[theirs].get_color()
    assert published["Alvi et al. (published)"].get_color() not in {
        c.lines[0].get_color() for c in ours.values()}
    assert table_figure(tidy[tidy["benchmark"] != "digits"], TABLE_SPECS["digits"]) is None
