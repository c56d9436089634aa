"""bench/export_epochs.py: the per-epoch rows committed between sessions keep every trial."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]


def _trial(out: Path, name: str, point: dict, epochs: list[int]) -> None:
    path = out / "tune" / "digits_grid" / name / "result.json"
    path.parent.mkdir(parents=True)
    lines = [json.dumps({"epoch": e, "train_acc": 0.9, "test_acc": 0.5 + 0.01 * e,
                         "config": {"lr": 1e-3, "point": point}}) for e in epochs]
    path.write_text("\n".join(lines) + "\n")


def test_two_methods_at_one_data_point_stay_two_trials_and_reruns_count_once(tmp_path):
    # A sweep stopped mid-way (no results.parquet): rows come from Tune's result.json files.
    # ERM under mi_backprop (K 80) and lntl at one (sigma, lam, seed); lntl re-ran epoch 2
    # after a restart from its checkpoint.
    point = {"sigma": 0.03, "lam": 0.01, "seed": 1}
    _trial(tmp_path, "a", {**point, "method": "mi_backprop", "K": 80}, [1, 2, 3])
    _trial(tmp_path, "b", {**point, "method": "lntl"}, [1, 2, 2, 3])
    dest = tmp_path / "rows" / "epochs.csv"
    proc = subprocess.run([sys.executable, "bench/export_epochs.py", str(tmp_path), str(dest)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "6 epochs of 2 trials" in proc.stdout
    rows = pd.read_csv(dest)
    assert rows.groupby(["method", "K"]).size().to_dict() == {("lntl", 0): 3,
                                                              ("mi_backprop", 80): 3}
