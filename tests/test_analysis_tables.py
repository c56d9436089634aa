"""Tables on synthetic results whose numbers are computed by hand."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis import build_all
from analysis.io import atomic_write_parquet
from analysis.results import final_rows, spearman
from analysis.tables import TIDY_COLUMNS, build_tables
from tests.synthetic import frame, trial

NAN = math.nan


def tables(rows: list[dict]) -> tuple[pd.DataFrame, str]:
    df = frame(rows)
    return build_tables(df, final_rows(df))


def cell(tidy: pd.DataFrame, row: str, column: str, block: str | None = None) -> pd.Series:
    sel = tidy[(tidy["row"] == row) & (tidy["column"] == column)]
    if block is not None:
        sel = sel[sel["block"] == block]
    assert len(sel) == 1, (row, column, block, sel)
    return sel.iloc[0]


def digits_rows(sigma: float = 0.03, K: int = 80) -> list[dict]:
    rows: list[dict] = []
    # lam 0: test acc .5 .6 .7 over seeds -> mean .6, std (ddof=1) .1
    for seed, acc in enumerate((0.5, 0.6, 0.7)):
        rows += trial(lam=0.0, sigma=sigma, K=K, seed=seed, mi=1.0, test_acc=acc)
    # lam 0.5: lowest MI -> chosen by lowest-MI; test acc .8 .9 -> .85, std .0707...
    for seed, acc in enumerate((0.8, 0.9)):
        rows += trial(lam=0.5, sigma=sigma, K=K, seed=seed, mi=0.1, test_acc=acc)
    # lam 1: the paper's lambda; best test acc (oracle) .95 with one seed
    rows += trial(lam=1.0, sigma=sigma, K=K, seed=0, mi=0.4, test_acc=0.95)
    # diverged seed of lam 1: excluded from the mean
    rows += trial(lam=1.0, sigma=sigma, K=K, seed=1, mi=NAN, test_acc=0.0, train_acc=0.1)
    return rows


def test_digits_table_numbers_are_hand_computed_means_and_stds() -> None:
    tidy, md = tables(digits_rows())
    assert list(tidy.columns) == TIDY_COLUMNS
    block = "Table 1 (test accuracy), K=80"
    erm = cell(tidy, "ERM (λ=0)", "σ=0.030", block)
    assert erm["mean"] == pytest.approx(0.6) and erm["std"] == pytest.approx(0.1)
    assert erm["n"] == 3 and erm["source"] == "ours" and erm["lam"] == 0.0
    assert erm["std"] == pytest.approx(float(np.std([0.5, 0.6, 0.7], ddof=1)))
    ours = cell(tidy, "Ours (λ=1, as the paper)", "σ=0.030", block)
    assert ours["mean"] == pytest.approx(0.95) and math.isnan(ours["std"]) and ours["n"] == 1
    low = cell(tidy, "Ours, lowest-MI (label-free)", "σ=0.030", block)
    assert low["lam"] == 0.5 and low["mean"] == pytest.approx(0.85)
    assert low["std"] == pytest.approx(math.sqrt(0.005)) and low["n"] == 2
    assert low["rule"] == "lowest-MI (label-free)"
    oracle = cell(tidy, "Ours, oracle (peeks at test labels)", "σ=0.030", block)
    assert oracle["lam"] == 1.0 and oracle["mean"] == pytest.approx(0.95)
    # markdown: the same numbers, the std convention stated, the diverged trial listed
    assert "| ERM (λ=0) | 0.600 ± 0.100 (n=3) |" in md
    assert "0.850 ± 0.071 (n=2, λ=0.5)" in md
    assert "0.950 (n=1)" in md
    assert "ddof=1" in md
    section = md.split("## Diverged or failed trials")[1]
    assert "digits_s0.03_l1_K80_seed1_mi_backprop" in section and "final mi is nan" in section


def test_published_rows_beside_ours() -> None:
    # 0.0300000004 matches the paper's 0.030 column (tolerance 1e-6); 0.1 has no column
    rows = digits_rows(sigma=0.0300000004) + digits_rows(sigma=0.1)
    tidy, md = tables(rows)
    pub = tidy[tidy["source"] == "published"]
    assert set(pub["column"]) == {"σ=0.030"}
    assert cell(pub, "Alvi et al. (published)", "σ=0.030")["mean"] == pytest.approx(0.794)
    assert cell(pub, "Kim et al. (published)", "σ=0.030")["mean"] == pytest.approx(0.911)
    ours_pub = cell(pub, "Ours (λ=1) (published)", "σ=0.030")
    assert ours_pub["mean"] == pytest.approx(0.959) and ours_pub["std"] == pytest.approx(0.008)
    assert cell(pub, "ERM (λ=0) (published)", "σ=0.030")["mean"] == pytest.approx(0.664)
    assert "| Kim et al. (published) | 0.911 | — |" in md


def test_one_block_per_K_and_selection_gap() -> None:
    tidy, md = tables(digits_rows(K=20) + digits_rows(K=80))
    assert {"Table 1 (test accuracy), K=20", "Table 1 (test accuracy), K=80"} <= set(
        tidy["block"])
    gap = cell(tidy, "lowest-MI (label-free)", "σ=0.030",
               "selection gap to oracle (test acc), K=80")
    assert gap["mean"] == pytest.approx(0.95 - 0.85) and gap["lam"] == 0.5
    assert cell(tidy, "oracle (peeks at test labels)", "σ=0.030",
                "selection gap to oracle (test acc), K=20")["mean"] == 0.0
    assert "### Table 1 (test accuracy), K=20" in md and "### Table 1 (test accuracy), K=80" in md


def test_spearman_on_monotone_cases() -> None:
    assert spearman([3.0, 2.0, 1.0, 0.5], [0.1, 0.2, 0.3, 0.4]) == pytest.approx(-1.0)
    assert spearman([1.0, 2.0, 3.0], [0.1, 0.5, 0.9]) == pytest.approx(1.0)
    assert math.isnan(spearman([1.0, 2.0], [1.0, 2.0]))
    # ties use average ranks: same as the Pearson correlation of the ranks
    assert spearman([1.0, 1.0, 2.0, 3.0], [1.0, 2.0, 3.0, 4.0]) == pytest.approx(
        float(np.corrcoef([1.5, 1.5, 3, 4], [1, 2, 3, 4])[0, 1]))


def test_spearman_in_tables() -> None:
    rows = []
    for lam, mi, acc in ((0.0, 1.0, 0.5), (0.5, 0.5, 0.6), (1.0, 0.2, 0.9)):
        rows += trial(lam=lam, mi=mi, test_acc=acc, sigma=0.02)
    for lam, mi, acc in ((0.0, 1.0, 0.5), (1.0, 0.2, 0.9)):  # only 2 lambdas
        rows += trial(lam=lam, mi=mi, test_acc=acc, sigma=0.05)
    tidy, md = tables(rows)
    rho = tidy[tidy["block"] == "Spearman ρ(MI, test acc), K=80"].set_index("row")
    assert rho.loc["σ=0.020", "mean"] == pytest.approx(-1.0)
    assert math.isnan(rho.loc["σ=0.050", "mean"])
    assert "| σ=0.020 | 3 | mi | -1.000 |  |" in md
    assert "fewer than 3 lambdas (2)" in md


def test_german_table() -> None:
    rows = []
    for seed, (acc, eo) in enumerate(((0.70, 0.4), (0.74, 0.5))):
        rows += trial(benchmark="german", sigma=NAN, K=30, lam=0.0, seed=seed, mi=0.3,
                      test_acc=acc, eo=eo)
        rows += trial(benchmark="german", sigma=NAN, K=30, lam=1.0, seed=seed, mi=0.05,
                      test_acc=acc - 0.02, eo=eo / 10)
        rows += trial(benchmark="german", method="svm", sigma=NAN, lam=NAN, K=0, seed=seed,
                      epochs=1, mi=NAN, test_acc=0.75, eo=0.1 + seed / 10,
                      trial_id=f"svm{seed}")
    tidy, md = tables(rows)
    assert set(tidy["benchmark"]) == {"german"}
    block = "Table 3 (accuracy, EO), K=30"
    svm = cell(tidy, "SVM", "EO", block)
    assert svm["mean"] == pytest.approx(0.15) and svm["n"] == 2
    nn = cell(tidy, "NN (λ=0)", "Acc.", block)
    assert nn["mean"] == pytest.approx(0.72) and nn["std"] == pytest.approx(0.04 / math.sqrt(2))
    assert cell(tidy, "Ours (λ=1, as the paper)", "EO", block)["mean"] == pytest.approx(0.045)
    assert cell(tidy, "Ours, lowest-MI (label-free)", "EO", block)["lam"] == 1.0
    assert cell(tidy, "NN + χ² (published)", "EO", block)["mean"] == pytest.approx(0.25)
    assert cell(tidy, "FERM (published)", "Acc.", block)["mean"] == pytest.approx(0.73)
    assert "## digits" not in md and "## imdb" not in md  # empty benchmarks are skipped
    # the SVM baseline (NaN mi, no lambda) is not a diverged trial
    assert "None." in md.split("## Diverged or failed trials")[1]


def test_imdb_table_columns() -> None:
    rows = []
    for split, other, base in (("EB1", "acc_eb2", 0.6), ("EB2", "acc_eb1", 0.5)):
        for lam in (0.0, 0.5, 0.9):
            rows += trial(benchmark="imdb", sigma=NAN, K=40, lam=lam, mi=1.0 - lam,
                          train_split=split, acc_test=base + 0.2 + lam / 10,
                          test_acc=base + 0.2 + lam / 10, **{other: base + lam / 10})
    tidy, md = tables(rows)
    block = "Table 2 (accuracy), K=40"
    assert cell(tidy, "ERM (λ=0)", "EB1→EB2", block)["mean"] == pytest.approx(0.6)
    assert cell(tidy, "ERM (λ=0)", "EB2→EB1", block)["mean"] == pytest.approx(0.5)
    paper = "Ours (λ=0.5 on EB1, 0.9 on EB2, as the paper)"
    assert cell(tidy, paper, "EB1→Test", block)["mean"] == pytest.approx(0.85)
    assert cell(tidy, paper, "EB2→Test", block)["mean"] == pytest.approx(0.79)
    assert cell(tidy, paper, "EB2→Test", block)["lam"] == pytest.approx(0.9)
    assert cell(tidy, "Kim et al. (published)", "EB2→EB1", block)["mean"] == pytest.approx(.642)
    assert "| Method | EB1→EB2 | EB1→Test | EB2→EB1 | EB2→Test |" in md


def test_empty_frame_gives_a_table_without_benchmarks() -> None:
    df = frame(trial())
    df = df.iloc[0:0]
    tidy, md = build_tables(df, final_rows(df))
    assert tidy.empty and list(tidy.columns) == TIDY_COLUMNS
    assert "No results rows." in md


def test_build_all_writes_tables(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    atomic_write_parquet(frame(digits_rows()), tmp_path / "results.parquet")
    written = build_all(tmp_path, figures=False)
    assert written == [tmp_path / "table.md", tmp_path / "table.parquet",
                       tmp_path / "table.tex"]
    assert capsys.readouterr().out == ""
    tidy = pd.read_parquet(tmp_path / "table.parquet")
    assert set(tidy["source"]) == {"ours", "published"}
    assert cell(tidy, "ERM (λ=0)", "σ=0.030", "Table 1 (test accuracy), K=80")["mean"] == \
        pytest.approx(0.6)
    assert (tmp_path / "table.md").read_text().startswith("# Results: synthetic")
    assert "Bias strength" not in (tmp_path / "table.md").read_text()  # no experiment.json


def test_bias_strength_from_experiment_json_is_a_table_per_palette(tmp_path: Path) -> None:
    atomic_write_parquet(frame(digits_rows()), tmp_path / "results.parquet")
    bias = [{"sigma": s, "seed": seed, "palette": "kim", "stroke": "flat",
             "colour_only_acc": acc}
            for s, seed, acc in ((0.02, 0, 0.80), (0.02, 1, 0.90), (0.05, 0, 0.61))]
    (tmp_path / "experiment.json").write_text(json.dumps({"bias_strength": bias}))
    build_all(tmp_path, figures=False)
    table = (tmp_path / "table.md").read_text()
    assert "| palette, stroke | σ=0.020 | σ=0.050 |" in table
    assert "| kim, flat | 0.850 | 0.610 |" in table  # the mean over seeds
    (tmp_path / "experiment.json").write_text("{not json")  # unreadable: no section, no crash
    build_all(tmp_path, figures=False)
    assert "Bias strength" not in (tmp_path / "table.md").read_text()


def _methods_rows() -> list[dict]:
    """mi_backprop with its own ERM (lam 0) and two other methods without one: a known
    competitor and a method the analysis has never heard of. Competitors report no MI."""
    rows = digits_rows()
    for seed, acc in enumerate((0.70, 0.72)):  # lowest mi_eval at lam 3
        rows += trial(method="grad_reversal", lam=3.0, K=0, seed=seed, mi=NAN,
                      mi_eval=0.2, test_acc=acc)
    rows += trial(method="grad_reversal", lam=1.0, K=0, seed=0, mi=NAN, mi_eval=0.5,
                  test_acc=0.66)
    rows += trial(method="my_method", lam=1.0, K=0, seed=0, mi=NAN, mi_eval=0.3,
                  test_acc=0.61)
    for row in rows:  # mi_eval on every mi_backprop row too, so the rules use it
        if row["method"] == "mi_backprop" and row["epoch"] == row["epochs"]:
            row["mi_eval"] = row["mi"] + 1.0 if math.isfinite(row["mi"]) else NAN
    return rows


def test_every_method_gets_rows_beside_the_published_ones_sharing_erm() -> None:
    tidy, md = tables(_methods_rows())
    block = "Table 1 (test accuracy), K=80"
    gr = "Grad. reversal (ours)"
    paper = cell(tidy, f"{gr} (λ=1, as the paper)", "σ=0.030", block)
    assert paper["mean"] == pytest.approx(0.66) and paper["source"] == "ours"
    low = cell(tidy, f"{gr}, lowest-MI (label-free)", "σ=0.030", block)
    assert low["lam"] == 3.0 and low["mean"] == pytest.approx(0.71)
    # ERM (lam 0) is shared: the competitor's oracle may pick it (it beats neither here)
    oracle = cell(tidy, f"{gr}, oracle (peeks at test labels)", "σ=0.030", block)
    assert oracle["lam"] == 3.0
    assert cell(tidy, "Kim et al. (published)", "σ=0.030", block)["source"] == "published"
    # each published row right below our rows of the same method; unpaired methods last
    rows = list(dict.fromkeys(tidy[tidy["block"] == block]["row"]))
    assert rows[:2] == ["ERM (λ=0)", "ERM (λ=0) (published)"]
    assert rows.index("Ours (λ=1) (published)") == rows.index("Ours, oracle (peeks at test "
                                                               "labels)") + 1
    assert rows.index("Kim et al. (published)") < rows.index("Ours (λ=1, as the paper)")
    tail = rows[rows.index("Ours (λ=1) (published)") + 1:]
    assert [r.split(" (")[0] for r in tail] == ["Grad. reversal"] * (len(tail) // 2) + [
        "my_method"] * (len(tail) // 2)
    # a method the analysis does not know still gets its rows, labelled as ours
    unknown = cell(tidy, "my_method (ours) (λ=1)", "σ=0.030", block)
    assert unknown["mean"] == pytest.approx(0.61)
    # competitors report no `mi`: not a reason to exclude them
    assert "my_method" not in md.split("## Diverged or failed trials")[1]
    # per-lambda sections and selection gaps per method, the shared ERM row among them
    assert "| grad_reversal, σ=0.030 | 0 | 0.600 ± 0.100" in md
    assert "| my_method, σ=0.030 | lowest-MI (label-free) |" in md


def test_a_competitor_run_at_its_own_lambda_sits_above_its_published_row() -> None:
    rows = digits_rows()
    for seed, acc in enumerate((0.80, 0.84)):
        rows += trial(method="lntl", lam=0.01, K=0, seed=seed, mi=NAN, mi_eval=0.4,
                      test_acc=acc)
    tidy, _ = tables(rows)
    block = "Table 1 (test accuracy), K=80"
    rows_in_order = list(dict.fromkeys(tidy[tidy["block"] == block]["row"]))
    fixed = cell(tidy, "Kim et al. (ours) (λ=0.01)", "σ=0.030", block)
    assert fixed["mean"] == pytest.approx(0.82) and fixed["n"] == 2
    kim = rows_in_order.index("Kim et al. (published)")
    assert rows_in_order[kim - 4] == "Kim et al. (ours) (λ=0.01)"  # then its 3 rule rows
    assert rows_in_order[kim - 5] == "Alvi et al. (published)"


def test_method_with_no_mi_backprop_rows_still_gets_table_1() -> None:
    rows = [r for r in _methods_rows() if r["method"] != "mi_backprop"]
    tidy, md = tables(rows)
    assert "### Table 1 (test accuracy)\n" in md
    assert cell(tidy, "my_method (ours) (λ=1)", "σ=0.030")["n"] == 1


def test_table_tex_has_one_booktabs_tabular_per_block_and_a_row_per_table_row(
        tmp_path: Path) -> None:
    import re
    import shutil
    import subprocess

    atomic_write_parquet(frame(_methods_rows()), tmp_path / "results.parquet")
    build_all(tmp_path, figures=False)
    tex = (tmp_path / "table.tex").read_text()
    tidy = pd.read_parquet(tmp_path / "table.parquet")
    blocks = tidy.groupby(["benchmark", "block"], sort=False)
    tabulars = re.findall(r"\\begin\{tabular\}\{l(c*)\}(.*?)\\end\{tabular\}", tex, re.S)
    assert len(tabulars) == blocks.ngroups == tex.count("\\begin{table}")
    for (key, cells), (cols, body) in zip(blocks, tabulars, strict=True):
        assert len(cols) == cells["column"].nunique(), key
        head, rows = body.split("\\midrule", 1)
        assert "\\toprule" in head and "\\bottomrule" in rows
        lines = [ln for ln in rows.splitlines() if ln.endswith("\\\\")]
        assert len(lines) == cells["row"].nunique(), key  # one line per table row
        assert all(ln.count(" & ") == len(cols) for ln in lines)
    # our cell and the published one, as LaTeX
    assert ("\nERM ($\\lambda$=0) & 0.600 $\\pm$ 0.100 (n=3) \\\\\n"
            "ERM ($\\lambda$=0) (published) & 0.664 $\\pm$ 0.007 \\\\\n") in tex
    # a rule below a published row that has rows of ours after it
    assert "Kim et al. (published) & 0.911 \\\\\n\\midrule\nOurs ($\\lambda$=1, as" in tex
    assert "my\\_method" in tex and tex.isascii()  # pdflatex reads no Greek
    engine = shutil.which("pdflatex")
    if engine:  # compile it where a LaTeX engine is installed
        doc = tmp_path / "doc.tex"
        doc.write_text("\\documentclass{article}\\usepackage{booktabs}\\begin{document}\n"
                       + tex + "\n\\end{document}\n")
        proc = subprocess.run([engine, "-interaction=nonstopmode", doc.name], cwd=tmp_path,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stdout[-2000:]


def test_gap_to_published_in_stds_flags_only_cells_beyond_two() -> None:
    rows = digits_rows()  # sigma .030: ERM .6 ± .1, lam 1 .95 (one seed)
    # lntl .70/.71/.72: .71 ± .01 against Kim's .911 (no std printed): -.201 = -20.1 std
    for seed, acc in enumerate((0.70, 0.71, 0.72)):
        rows += trial(method="lntl", lam=0.01, K=0, seed=seed, mi=NAN, test_acc=acc)
    # confusion, one seed, against Alvi's .794 (no std): no std on either side
    rows += trial(method="confusion", lam=1.0, K=0, seed=0, mi=NAN, test_acc=0.70)
    _, md = tables(rows)
    section = md.split("K=80: ours − published")[1].split("###")[0]
    # ERM .6 vs .664: -.064 over its own std .1 (> the paper's .007) = -0.6, not flagged
    assert "| ERM (λ=0) | -0.064 (-0.6 std) |" in section
    # lam 1, one seed: the paper's std .008 is the only one: -.009 / .008 = -1.1
    assert "| Ours (λ=1, as the paper) | -0.009 (-1.1 std) |" in section
    assert "| Kim et al. (ours) (λ=0.01) | -0.201 (-20.1 std) **>2** |" in section
    assert "| Alvi et al. (ours) (λ=1) | -0.094 (no std) |" in section
    assert "1 of 4 cells differ by more than 2 std" in section
    assert "lowest-MI" not in section  # rule rows change lambda with the data: left out


def test_wall_time_per_trial_sums_each_trials_epochs() -> None:
    rows = digits_rows()  # 3-epoch trials
    for row in rows:
        # lam 0: 60 s an epoch (3 min a trial); other lambdas 120 s, one epoch without
        # epoch_s falls back to its time_s (training alone)
        row["epoch_s"] = 60.0 if row["lam"] == 0.0 else 120.0
        if row["lam"] == 0.5 and row["epoch"] == 1:
            row["epoch_s"] = NAN
            row["time_s"] = 60.0
    _, md = tables(rows)
    section = md.split("## Wall time per trial")[1].split("##")[0]
    assert "| digits | mi_backprop | λ=0 | 3 | 3.0 | 3.0 ± 0.0 | 1.00 | 0.15 |" in section
    # lam 0.5: (60 + 120 + 120) s = 5 min a trial, two trials
    assert "| digits | mi_backprop | λ=0.5 | 2 | 3.0 | 5.0 ± 0.0 | 1.67 | 0.17 |" in section
    # lam 1: the diverged seed counts too (its time was spent)
    assert "| digits | mi_backprop | λ=1 | 2 | 3.0 | 6.0 ± 0.0 | 2.00 | 0.20 |" in section


def test_every_K_of_german_and_imdb_shares_the_erm_run_once() -> None:
    # lam 0 runs under the first K only; a second K's rule rows choose among its own lambdas
    # and that ERM, as the selection-gap section of the same K does
    rows = []
    for K in (30, 60):
        for seed in (0, 1):
            if K == 30:
                rows += trial(benchmark="german", sigma=NAN, K=K, lam=0.0, seed=seed, mi=0.3,
                              test_acc=0.75, eo=0.4)
            rows += trial(benchmark="german", sigma=NAN, K=K, lam=1.0, seed=seed, mi=0.05,
                          test_acc=0.70, eo=0.05)
    for split, other in (("EB1", "acc_eb2"), ("EB2", "acc_eb1")):
        for K in (20, 40):
            for lam in ((0.0, 0.9) if K == 20 else (0.9,)):
                rows += trial(benchmark="imdb", sigma=NAN, K=K, lam=lam, mi=1.0 - lam,
                              train_split=split, acc_test=0.8 - lam / 10,
                              test_acc=0.8 - lam / 10, **{other: 0.6})
    tidy, md = tables(rows)
    oracle = "Ours, oracle (peeks at test labels)"
    german = cell(tidy, oracle, "Acc.", "Table 3 (accuracy, EO), K=60")
    assert german["lam"] == 0.0 and german["mean"] == pytest.approx(0.75)
    assert cell(tidy, "NN (λ=0)", "EO", "Table 3 (accuracy, EO), K=60")["n"] == 2
    section = md.split("german: selection gap to oracle (test acc), K=60")[1].split("###")[0]
    assert "| all | oracle (peeks at test labels) | 0 | 0.750 |" in section
    imdb = cell(tidy, oracle, "EB2→Test", "Table 2 (accuracy), K=40")
    assert imdb["lam"] == 0.0 and imdb["mean"] == pytest.approx(0.8) and imdb["n"] == 1


def test_german_without_erm_still_has_its_row() -> None:
    # a competitor alone, no ERM: the NN row says so, as Table 1's ERM row does
    rows = trial(benchmark="german", method="grad_reversal", sigma=NAN, K=0, lam=1.0, mi=NAN,
                 test_acc=0.7, eo=0.05)
    tidy, md = tables(rows)
    nn = cell(tidy, "NN (λ=0)", "Acc.", "Table 3 (accuracy, EO)")
    assert nn["n"] == 0 and math.isnan(nn["mean"])
    assert "| NN (λ=0) | — | — |" in md
    assert cell(tidy, "Grad. reversal (ours) (λ=1)", "EO")["mean"] == pytest.approx(0.05)


# The benchmarks whose tables print published rows beside ours: the paper's three, and
# ReBias's Biased MNIST. Any other benchmark (a contributor's) may have none.
WITH_PUBLISHED_ROWS = ("digits", "german", "imdb", "biased_mnist")


def test_every_published_row_has_a_value_in_each_column_of_its_spec() -> None:
    from analysis.specs import TABLE_SPECS, ColumnAxis
    from unbiased.benchmarks import registered
    from unbiased.benchmarks.digits.spec import PAPER_SIGMAS as DIGITS_SIGMAS

    assert list(TABLE_SPECS) == list(registered())  # one table per registered benchmark
    for name in WITH_PUBLISHED_ROWS:
        assert TABLE_SPECS[name].published, name
    for spec in TABLE_SPECS.values():
        assert all(p.source for p in spec.published), spec.benchmark
        for p in spec.published:
            # an axis table's rows share their axis values (digits: the paper's sigmas)
            keys = ((list(DIGITS_SIGMAS) if spec.benchmark == "digits"
                     else list(spec.published[0].values))
                    if isinstance(spec.columns, ColumnAxis)
                    else [c.label for c in spec.columns])
            assert list(p.values) == keys, (spec.benchmark, p.row)


def test_a_benchmark_is_a_spec_away(monkeypatch: pytest.MonkeyPatch) -> None:
    # the builder and the results contract read the specs, no list of names of their own
    from analysis.published import PublishedRow
    from analysis.results import validate
    from analysis.specs import TABLE_SPECS, Column, TableSpec

    toy = TableSpec(benchmark="toy", name="Toy", table="Table 9", measures="accuracy",
                    columns=(Column("Acc.", ("test_acc",)),),
                    published=(PublishedRow("ERM (λ=0)", {"Acc.": (0.5, NAN)}, "nowhere"),))
    monkeypatch.setitem(TABLE_SPECS, "toy", toy)
    rows = []
    for lam, acc in ((0.0, 0.6), (1.0, 0.7)):
        rows += trial(benchmark="toy", sigma=NAN, K=5, lam=lam, test_acc=acc)
    df = validate(frame(rows))
    tidy, md = build_tables(df, final_rows(df))
    assert "## toy: Toy (Table 9)\n\n### Table 9 (accuracy), K=5\n\n| Method | Acc. |" in md
    assert cell(tidy, "ERM (λ=0)", "Acc.")["mean"] == pytest.approx(0.6)
    assert cell(tidy, "Ours (λ=1, as the paper)", "Acc.")["mean"] == pytest.approx(0.7)
    assert cell(tidy, "ERM (λ=0) (published)", "Acc.")["mean"] == 0.5


@pytest.mark.parametrize(("preset", "values", "line"), [
    ("quick", {"source": "mnist5k", "epochs": 8, "palette": "separated"},
     "quick preset: 4,000 training digits (mnist5k), 8 epochs, palette separated — a smoke "
     "run, not comparable with the published rows.\n"),
    ("table1", {"source": "mnist5k", "epochs": 6, "palette": "kim"},
     "table1 preset: 4,000 training digits (mnist5k), 6 epochs, palette kim: neither the "
     "paper's protocol nor ours on full MNIST, so not comparable with the published rows.\n"),
    ("my_preset", {}, "my_preset preset: ? training digits (?), ? epochs, palette ?: neither"),
    ("table1", {"source": "mnist", "epochs": 6, "palette": "kim"}, None),
    ("paper", {}, None),  # a record without the setting: the preset's own
    (None, {}, None),  # no preset recorded: nothing says the runs are off the protocol
])
def test_gaps_in_stds_only_on_the_published_rows_protocol(
        preset: str | None, values: dict, line: str | None) -> None:
    df = frame(digits_rows())
    experiment = {"preset": preset, "values": values} if preset else {}
    _, md = build_tables(df, final_rows(df), experiment=experiment)
    table = md.split("## digits: Colored MNIST (Table 1)\n\n")[1]
    if line is None:
        assert table.startswith("### Table 1 (test accuracy), K=80\n")
        assert "K=80: ours − published" in md and " std)" in md
    else:
        assert table.startswith(line)
        assert "ours − published" not in md and " std)" not in md
        assert "(published) | 0.664 ± 0.007 |" in md  # the published rows stay beside ours


def test_german_quick_says_what_it_is_and_paper_is_compared() -> None:
    rows = []
    for seed, acc in enumerate((0.74, 0.76)):
        rows += trial(benchmark="german", sigma=NAN, K=30, lam=0.0, seed=seed, mi=0.3,
                      test_acc=acc, eo=0.02)
    df = frame(rows)
    quick = {"preset": "quick", "values": {"epochs": 20, "lr": 0.001}}
    _, md = build_tables(df, final_rows(df), experiment=quick)
    assert ("## german: German credit (Table 3)\n\nquick preset: 20 epochs at lr 0.001 (the "
            "paper: 500 at 1e-05) — a smoke run, not comparable with the published rows.\n"
            "\n### Table 3") in md
    assert "ours − published" not in md
    _, md = build_tables(df, final_rows(df), experiment={"preset": "paper", "values": {}})
    assert "### Table 3 (accuracy, EO), K=30: ours − published" in md


def test_the_digits_spec_counts_the_training_digits_as_the_data_does() -> None:
    from unbiased.benchmarks.digits.data import MNIST5K_TRAIN_PER_CLASS, NUM_CLASSES
    from unbiased.benchmarks.digits.spec import TRAIN_ROWS as DIGITS_TRAIN_ROWS

    assert DIGITS_TRAIN_ROWS["mnist5k"] == MNIST5K_TRAIN_PER_CLASS * NUM_CLASSES


def test_rows_without_sigma_are_grouped_by_their_own_data_axes() -> None:
    """`sigma` is digits' axis, not a column of the contract: rows of other benchmarks may
    lack it, and each group, front and label comes from the benchmark's own axes."""
    from analysis.pareto import front_markdown, pareto_front
    from analysis.results import validate

    rows = []
    for rho, base in ((0.997, 0.4), (0.999, 0.2)):
        for seed in (0, 1):
            for lam in (0.0, 1.0):
                rows += trial(benchmark="biased_mnist", sigma=NAN, K=80, lam=lam, seed=seed,
                              mi=1.0 - lam / 2, mi_eval=1.0 - lam / 2, rho=rho,
                              test_acc=base + lam / 10 + seed / 100, biased_acc=0.9,
                              trial_id=f"rho{rho}_lam{lam}_seed{seed}")
    for split in ("EB1", "EB2"):
        rows += trial(benchmark="imdb", sigma=NAN, K=40, lam=0.0, mi=1.0, train_split=split,
                      acc_test=0.7, test_acc=0.7, acc_eb1=0.6, acc_eb2=0.6)
    df = validate(frame(rows).drop(columns="sigma"))
    assert "sigma" not in df.columns and df["rho"].dtype == "float64"
    assert df["train_split"].dtype == object  # typed from the imdb presets' values
    tidy, md = build_tables(df, final_rows(df))
    erm = tidy[(tidy["benchmark"] == "biased_mnist") & (tidy["row"] == "ERM (λ=0)")]
    assert sorted(erm["mean"].round(4)) == [0.205, 0.405]  # one cell per rho, 2 seeds each
    assert "ρ=0.997" in md and "ρ=0.999" in md and "train EB1" in md
    finals = final_rows(df)
    front = pareto_front(finals[finals["benchmark"] == "biased_mnist"])
    assert list(front.columns[:3]) == ["benchmark", "rho", "seed"]
    assert len(front.groupby(["rho", "seed"])) == 4  # a study per (rho, seed)
    assert set(front.loc[front["chosen"], "lam"]) == {1.0}
    assert "## biased_mnist ρ=0.997 seed=0" in front_markdown(front, finals)


def test_a_wrongly_typed_data_axis_is_one_line() -> None:
    from analysis.results import ResultsError, validate

    df = frame(trial(benchmark="imdb", sigma=NAN, K=40, lam=0.0, train_split="EB1"))
    with pytest.raises(ResultsError, match="'train_split' has dtype float64, expected string"):
        validate(df.assign(train_split=1.5))
    with pytest.raises(ResultsError, match="column 'rho' has dtype .*, expected float"):
        validate(df.assign(rho="high"))
