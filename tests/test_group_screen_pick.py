"""bench/group_screen_pick.py --rows: the selection rules applied per (axis value, seed) to
several settings' exported rows, each setting's trial a candidate there."""

from __future__ import annotations

import runpy
import subprocess
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
PATH = ROOT / "bench" / "group_screen_pick.py"
ROWS = ROOT / "bench" / "results" / "group_screen_68"


def _module() -> dict:
    return runpy.run_path(str(PATH))  # the script's names, not run as __main__


def _rows(tmp_path: Path, name: str, mi_eval: dict[tuple[float, int], float],
          floor: dict[tuple[float, int], float] | None = None) -> Path:
    """Two seeds x two sigmas of 2 epochs; each trial reports epoch 1 (its `selected_epoch`)
    with `mi_eval` as given, its last epoch a test accuracy no rule may read."""
    rows = []
    for (sigma, seed), mi in mi_eval.items():
        for epoch in (1, 2):
            rows.append({"method": "m", "K": 1, "sigma": sigma, "lam": 1.0, "seed": seed,
                         "epoch": epoch, "train_acc": .99, "status": "ok", "epochs": 2,
                         "test_acc": (.5 + mi / 10 if epoch == 1 else .0),
                         "mi_eval": mi if epoch == 1 else 9.0, "mi_eval_cond": 0.0,
                         "mi_floor": (floor or {}).get((sigma, seed), -5.0),
                         "mi_floor_cond": -5.0, "selected_epoch": 1,
                         "selected_mi_eval": mi, "selected_mi_eval_cond": 0.0,
                         "trial_id": f"{name}_{sigma}_{seed}"})
    path = tmp_path / f"{name}.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def test_rows_pick_per_point_at_the_reported_epoch(tmp_path):
    pick = _module()
    low = {(.02, 0): .1, (.02, 1): .9, (.05, 0): .2, (.05, 1): .3}
    high = {(.02, 0): .5, (.02, 1): .4, (.05, 0): .7, (.05, 1): .8}
    lines = pick["rows_report"]({"a": _rows(tmp_path, "a", low), "b": _rows(tmp_path, "b", high)})
    text = "\n".join(lines)
    # seed 1 at sigma .02: b's MI (.4) is below a's (.9), so the label-free rule takes b there;
    # the oracle takes the higher test accuracy at the reported epoch (.5 + mi / 10: a's).
    assert "| 0.02 | 1 |" in text and "| b (0.540) | a (0.590) |" in text
    assert "| 0.02 | 0 |" in text and "| a (0.510) | b (0.550) |" in text
    assert "lowest-MI (label-free), sigma 0.02: 0.510 / 0.540 (mean 0.525" in text
    assert "lowest-MI (label-free), sigma 0.05: 0.520 / 0.530 (mean 0.525" in text
    assert "oracle (peeks at test labels), sigma 0.05: 0.570 / 0.580 (mean 0.575" in text


def test_rows_pick_passes_over_a_failed_estimate(tmp_path):
    pick = _module()
    low = {(.02, 0): .1, (.02, 1): .2}
    high = {(.02, 0): .5, (.02, 1): .6}
    # a's estimate at seed 0 reads far below its prediction floor: not a measured MI.
    failed = _rows(tmp_path, "a", low, floor={(.02, 0): 3.0})
    text = "\n".join(pick["rows_report"]({"a": failed, "b": _rows(tmp_path, "b", high)}))
    assert "(failed)" in text
    assert "lowest-MI (label-free), sigma 0.02: 0.550 / 0.520" in text


def test_rows_pick_reads_the_committed_rows():
    """Colored MNIST's balanced-MI rows at lambda .3 and 1 (docs/MEASURED.md, balanced MI):
    the label-free rule takes lambda 1 at 8 of 9 points."""
    out = subprocess.run(
        [sys.executable, str(PATH), "--rows",
         f"λ .3={ROWS / 'digits_balanced_rows_lam0.3.csv'}",
         f"λ 1={ROWS / 'digits_balanced_rows.csv'}"],
        capture_output=True, text=True, timeout=120, check=True).stdout
    label_free = [line.split("|")[-3].strip() for line in out.splitlines()
                  if line.startswith("| 0.0")]
    assert len(label_free) == 9
    assert sum(p.startswith("λ 1 ") for p in label_free) == 8


def test_rows_pick_refuses_bad_arguments(tmp_path):
    out = subprocess.run([sys.executable, str(PATH), "--rows", f"a={tmp_path / 'none.csv'}",
                          "b=x.csv"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.startswith("error: --rows takes two or more NAME=CSV")
    assert "not a file" in out.stderr


def test_screen_picks_rebuilt_from_the_exported_csvs():
    """picks.md was written from the screens' results.parquet on the machine that ran them;
    the committed CSVs alone give the same candidates, numbers and picks."""
    out = subprocess.run([sys.executable, str(PATH), str(ROWS)], capture_output=True,
                         text=True, timeout=120, check=True).stdout
    committed = (ROWS / "picks.md").read_text()
    for bench in ("biased_mnist", "digits"):
        assert f"### {bench}" in out
    for line in committed.splitlines():
        if line.startswith("| group_dro eta0.01") or line.startswith("- "):
            assert line in out


def test_rows_pick_skips_a_trial_still_running(tmp_path):
    pick = _module()
    path = _rows(tmp_path, "a", {(.02, 0): .1, (.02, 1): .2})
    rows = pd.read_csv(path)
    rows = rows[~((rows["seed"] == 1) & (rows["epoch"] == 2))]  # seed 1 exported at epoch 1
    rows.loc[rows["seed"] == 1, "selected_epoch"] = float("nan")
    rows.to_csv(path, index=False)
    text = "\n".join(pick["rows_report"]({"a": path, "b": _rows(tmp_path, "b", {(.02, 0): .5,
                                                                               (.02, 1): .6})}))
    assert "| 0.02 | 1 | — |" in text
