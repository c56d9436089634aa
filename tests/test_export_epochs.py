"""sweeps/export_epochs.py: the per-epoch rows committed between sessions keep every trial.

The first test runs it as a script; the others through `python -m sweeps export` in-process
(it is importable, and the entry point reaches it)."""

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
    proc = subprocess.run([sys.executable, "sweeps/export_epochs.py", str(tmp_path), str(dest)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "6 epochs of 2 trials" in proc.stdout
    rows = pd.read_csv(dest)
    assert rows.groupby(["method", "K"]).size().to_dict() == {("lntl", 0): 3,
                                                              ("mi_backprop", 80): 3}


def _export(out: Path, dest: Path, *extra: str, capsys) -> str:
    """What `python -m sweeps export OUT DEST` prints."""
    from sweeps.__main__ import main

    capsys.readouterr()
    assert main(["export", str(out), str(dest), *extra]) == 0
    return capsys.readouterr().out


def test_exporting_part_of_a_grid_into_the_csv_keeps_its_other_trials(tmp_path, capsys):
    # Session 1 exported trials a (3 epochs) and b (2 epochs); session 2 ran only part of
    # the grid (a `--method` or `--seeds` run): b again, cut after epoch 1, and a new c.
    # Exporting it back into the same CSV keeps a and b's two epochs and adds c.
    first, second = tmp_path / "run1", tmp_path / "run2"
    a = {"sigma": 0.03, "lam": 1.0, "seed": 0, "method": "mi_backprop", "K": 80}
    b = {"sigma": 0.045, "lam": 0.01, "seed": 1, "method": "lntl"}
    c = {"sigma": 0.045, "lam": 0.01, "seed": 2, "method": "lntl"}
    _trial(first, "a", a, [1, 2, 3])
    _trial(first, "b", b, [1, 2])
    _trial(second, "b", b, [1])
    _trial(second, "c", c, [1, 2, 3])
    dest = tmp_path / "epochs.csv"
    _export(first, dest, capsys=capsys)
    out = _export(second, dest, capsys=capsys)
    assert "8 epochs of 3 trials (2 of them kept from the CSV it replaced)" in out
    rows = pd.read_csv(dest)
    assert rows.groupby(["method", "seed"])["epoch"].max().to_dict() == {
        ("lntl", 1): 2, ("lntl", 2): 3, ("mi_backprop", 0): 3}
    # a trial the new run holds more epochs of takes the new rows
    third = tmp_path / "run3"
    _trial(third, "a", a, [1, 2, 3, 4])
    _export(third, dest, capsys=capsys)
    assert pd.read_csv(dest).query("method == 'mi_backprop'")["epoch"].max() == 4
    # --replace: this run's rows alone
    out = _export(second, dest, "--replace", capsys=capsys)
    assert "4 epochs of 2 trials" in out and "kept" not in out


def test_a_benchmark_without_sigma_keeps_one_trial_per_data_point(tmp_path, capsys):
    # Biased MNIST's data axis is rho (the registry's data_axes), its rows have no sigma:
    # two rho values at one (lam, seed) are two trials, from Tune's files and from
    # results.parquet alike.
    run = tmp_path / "run"
    for rho, name in ((0.997, "a"), (0.999, "b")):
        _trial(run, name, {"rho": rho, "lam": 1.0, "seed": 0, "method": "mi_backprop",
                           "K": 80}, [1, 2])
    out = _export(run, tmp_path / "tune.csv", capsys=capsys)
    assert "4 epochs of 2 trials" in out
    rows = pd.read_csv(tmp_path / "tune.csv")
    assert rows.groupby("rho")["epoch"].nunique().to_dict() == {0.997: 2, 0.999: 2}

    rows.assign(sigma=float("nan")).to_parquet(run / "results.parquet")
    out = _export(run, tmp_path / "parquet.csv", capsys=capsys)
    assert "4 epochs of 2 trials" in out


def test_a_stopped_sweeps_records_are_its_rows(tmp_path, capsys):
    # A sweep stopped mid-way (no results.parquet) run with records (trainables/record.py):
    # each grid point's rows come from its record, a bundle's members each a trial of their
    # own, with the key the sweep's results would give them.
    from trainables.record import RecordStore

    records = RecordStore.at(str(tmp_path / "tune"), "digits_grid")
    plain = {"sigma": 0.03, "method": "lntl", "lam": 0.01, "seed": 1}
    records.start("p", {"lr": 1e-3, "epochs": 3, **plain})
    records.write("p", [{"epoch": e, "train_acc": 0.9, "test_acc": 0.5} for e in (1, 2)], None)
    members = [{"sigma": 0.03, "method": "mi_backprop", "lam": lam, "seed": 0, "K": 2}
               for lam in (0.0, 1.0)]
    records.start("b", {"lr": 1e-3, "epochs": 3, "members": members})
    records.write("b", [{"epoch": 1, "m0/epoch": 1, "m0/test_acc": 0.4, "m1/epoch": 1,
                         "m1/test_acc": 0.3}], {"state_m0.pt": b"", "state_m1.pt": b""})
    dest = tmp_path / "epochs.csv"
    assert "4 epochs of 3 trials" in _export(tmp_path, dest, capsys=capsys)
    rows = pd.read_csv(dest).set_index("trial_id")
    assert rows.loc["sigma=0.03_method=mi_backprop_lam=1.0_seed=0_K=2", "test_acc"] == 0.3
    assert list(rows.loc["p", "epoch"]) == [1, 2]
    assert json.loads(rows.loc["p", "config"].iloc[0])["lr"] == 1e-3


def test_rows_that_are_not_a_sweeps_epochs_are_one_error_line_and_the_csv_is_untouched(
        tmp_path, capsys):
    from sweeps.__main__ import main

    out = tmp_path / "run"
    _trial(out, "a", {"sigma": 0.03, "lam": 1.0, "seed": 0, "method": "lntl"}, [1, 2])
    dest = tmp_path / "epochs.csv"
    _export(out, dest, capsys=capsys)
    before = dest.read_bytes()
    other = tmp_path / "other.csv"
    other.write_text("name,score\nx,1\n")
    for args, named in (([str(other), str(dest)], "other.csv holds no sweep's epochs: no "
                                                  "column method, lam, seed, epoch"),
                        ([str(out), str(other)], "other.csv holds no sweep's epochs")):
        capsys.readouterr()
        assert main(["export", *args]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and named in err and err.count("\n") == 1, err
        assert dest.read_bytes() == before
    assert other.read_text() == "name,score\nx,1\n"
