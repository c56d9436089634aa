"""`--done CSV`: a grid continued on a new machine from the per-epoch rows an earlier run left
(sweeps/export_epochs.py), without Tune's state: finished trials are not run again and their
rows join the results as if one run had done them all."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import ONE_AT_A_TIME
from tests.test_reliability import (
    TINY,
    _in_process,
    _one_line_error,
    check_stopped,
    stop_driver,
)

ROOT = Path(__file__).resolve().parents[1]
GRID = [*TINY, "--lam", "0,1", "--epochs", "2", "--lr", "0.001"]


def _export(out: Path, dest: Path) -> pd.DataFrame:
    proc = subprocess.run([sys.executable, "sweeps/export_epochs.py", str(out), str(dest)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return pd.read_csv(dest)


def _rows(path: Path, epochs: list[int], lr: float = 0.001) -> Path:
    """A CSV as export_epochs writes it, holding the ERM trial of GRID (lam 0)."""
    config = json.dumps({"lr": lr, "epochs": 2, "root": "/elsewhere", "sigma": 0.03})
    pd.DataFrame([{"method": "mi_backprop", "K": 2, "sigma": 0.03, "lam": 0.0, "seed": 0,
                   "epoch": e, "train_acc": 0.9, "test_acc": 0.4 + e / 10,
                   "selected_epoch": 2 if e == 2 else None, "trial_id": "abc_00000",
                   "status": "ok", "config": config} for e in epochs]).to_csv(path, index=False)
    return path


@pytest.mark.ray
def test_finished_trials_are_left_out_before_anything_starts(tmp_path):
    proc = _in_process(*GRID, "--done", str(_rows(tmp_path / "e.csv", [1, 2])), "--dry-run",
                   "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    assert "1 trials" in proc.stdout.splitlines()[0]
    assert "1 of 2 trials finished in" in proc.stdout
    listed = proc.stdout.split("(dry run: nothing started)")[1]
    assert re.search(r"mi_backprop\s+0\.03\s+1\.0", listed)
    assert not re.search(r"mi_backprop\s+0\.03\s+0\.0", listed)


@pytest.mark.ray
def test_a_trial_with_epochs_missing_runs_again(tmp_path):
    proc = _in_process(*GRID, "--done", str(_rows(tmp_path / "e.csv", [1])), "--dry-run",
                   "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    assert "0 of 2 trials finished in" in proc.stdout
    assert "2 trials" in proc.stdout.splitlines()[0]


@pytest.mark.ray
def test_rows_of_another_grid_are_refused_in_one_line(tmp_path):
    proc = _in_process(*GRID, "--done", str(_rows(tmp_path / "e.csv", [1, 2], lr=0.01)),
                   "--out", str(tmp_path / "out"))
    _one_line_error(proc, "ran with lr=0.01, this sweep has lr=0.001")
    assert not (tmp_path / "out").exists()


@pytest.mark.ray
def test_bad_done_flags_are_one_line(tmp_path):
    _one_line_error(_in_process(*GRID, "--done", str(tmp_path / "nope.csv")), "is not a file")
    _one_line_error(_in_process(*GRID, "--done", str(_rows(tmp_path / "e.csv", [1, 2])),
                            "--resume", "--out", str(tmp_path / "out")),
                    "--resume continues")
    (tmp_path / "bad.csv").write_text("sigma,lam\n0.03,0\n")
    _one_line_error(_in_process(*GRID, "--done", str(tmp_path / "bad.csv")), "no column method")


@pytest.mark.ray
def test_a_grid_continued_from_exported_rows_equals_one_run(ray_local, tmp_path):
    # First machine: the whole grid (2 trials). Its export is what a session commits.
    first = _in_process(*GRID, *ONE_AT_A_TIME, "--out", str(tmp_path / "a"))
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    exported = _export(tmp_path / "a", tmp_path / "a.csv")
    assert {"config", "trial_id", "status"} <= set(exported.columns)
    # Say the machine went while lam 1 was at its second epoch: only lam 0 is whole.
    cut = exported[~((exported["lam"] == 1.0) & (exported["epoch"] == 2))]
    cut.to_csv(tmp_path / "cut.csv", index=False)

    second = _in_process(*GRID, *ONE_AT_A_TIME, "--done", str(tmp_path / "cut.csv"), "--out",
                         str(tmp_path / "b"))
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-2000:]
    assert "1 of 2 trials finished in" in second.stdout
    ran = set(re.findall(r"lam=(\S+) K=2 seed=0: epoch", second.stdout))
    assert ran == {"1.0"}, ran  # the finished ERM trial did not run again

    keys = ["lam", "epoch"]
    whole = pd.read_parquet(tmp_path / "a" / "results.parquet").sort_values(keys)
    joined = pd.read_parquet(tmp_path / "b" / "results.parquet").sort_values(keys)
    assert list(joined.columns) == list(whole.columns)
    assert len(joined) == 4 and joined.groupby("lam")["epoch"].nunique().eq(2).all()
    # Same seeds, same code: the re-run trial and the taken-over one equal the first run.
    for column in ("test_acc", "train_acc", "mi_eval", "mi_eval_cond", "selected"):
        pd.testing.assert_series_equal(joined[column].reset_index(drop=True),
                                       whole[column].reset_index(drop=True), rtol=1e-12)
    assert (joined["status"] == "ok").all()
    assert (tmp_path / "b" / "table.md").read_text().count("|") > 10

    # Its export holds both trials (the one taken over too), so a third machine runs nothing.
    again = _export(tmp_path / "b", tmp_path / "b.csv")
    assert again.groupby("lam")["epoch"].nunique().to_dict() == {0.0: 2, 1.0: 2}
    third = _in_process(*GRID, *ONE_AT_A_TIME, "--done", str(tmp_path / "b.csv"), "--out",
                        str(tmp_path / "c"))
    assert third.returncode == 0, third.stdout[-2000:] + third.stderr[-2000:]
    assert "2 of 2 trials finished in" in third.stdout and "epoch 1/2" not in third.stdout
    assert "TensorBoard" not in third.stdout  # no Tune run: no event files to point at
    rebuilt = pd.read_parquet(tmp_path / "c" / "results.parquet").sort_values(keys)
    pd.testing.assert_series_equal(rebuilt["test_acc"].reset_index(drop=True),
                                   whole["test_acc"].reset_index(drop=True), rtol=1e-12)


@pytest.mark.ray
@pytest.mark.system
def test_a_grid_stopped_by_ctrl_c_leaves_nothing_behind_and_resumes_in_order(
        ray_local, tmp_path):
    # One trial at a time (ONE_AT_A_TIME), lam 0 seed 0 taken over from rows (--done), Ctrl-C
    # (SIGINT to the driver) during the first trial that runs, two not started: the stop
    # leaves no process and says how to resume (test_reliability.py: check_stopped; a
    # SIGTERM to the driver's whole group: test_group_signal.py). The resumed run keeps the
    # rows it took over and finishes the rest in the grid's order (seed by seed), not in the
    # order Tune saved them. The resume runs in this process, on the session's Ray.
    out = tmp_path / "out"
    args = [*GRID, "--seeds", "0,1", *ONE_AT_A_TIME, "--out", str(out)]
    done = _rows(tmp_path / "e.csv", [1, 2])
    stopped = stop_driver([*args, "--done", str(done)], signal.SIGINT, "epoch 1/2")
    check_stopped(stopped, signal.SIGINT, out)

    resumed = _in_process(*args, "--resume")
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    # The rows --done took over became the point's record, and the trial the stop cut off
    # may have written its last epoch's record before it ended: the resume reads both there.
    done = int(re.search(r"resume: (\d) of 4 trials already finished", resumed.stdout)[1])
    grid = [f"method=mi_backprop sigma=0.03 lam={lam} K=2 seed={seed}"
            for seed in range(2) for lam in ("0.0", "1.0")]
    finished = re.findall(r"finished \d+/\d+: (.*)", resumed.stdout)
    assert done in (1, 2) and [f.strip() for f in finished] == grid[done:], finished
    # the 2 trials that had not started are not listed one warning line each on resume
    assert "Failed to fetch metrics" not in resumed.stdout + resumed.stderr
    df = pd.read_parquet(out / "results.parquet")
    assert df.groupby(["lam", "seed"])["epoch"].nunique().eq(2).all() and len(df) == 8
    taken = df[(df["lam"] == 0.0) & (df["seed"] == 0)].sort_values("epoch")
    assert taken["test_acc"].round(6).tolist() == [0.5, 0.6]  # the CSV's, not a re-run
    assert taken["trial_id"].eq("sigma=0.03_method=mi_backprop_lam=0.0_seed=0_K=2").all()


def test_a_trial_taken_over_keeps_its_stopping_rules_warning(tmp_path):
    # Its own run ended "ok; no epoch with a usable ...": the stopping rule's note lives only
    # in that status, and the table's warning list must still show it after --done.
    from sweeps.finished_trials import import_done, point_records, read_done, split_done
    from sweeps.results_frame import results_frame
    from trainables.record import RecordStore

    note = ("no epoch with a usable mi_eval_cond (NaN or below its prediction floor): "
            "last epoch")
    rows = pd.read_csv(_rows(tmp_path / "e.csv", [1, 2]))
    rows["status"] = "ok; " + note
    rows.to_csv(tmp_path / "e.csv", index=False)
    keys = ("method", "K", "sigma", "lam", "seed")
    point = {"sigma": 0.03, "method": "mi_backprop", "lam": 0.0, "seed": 0, "K": 2}
    records, fixed = RecordStore.at(str(tmp_path / "tune"), "g"), {"epochs": 2, "lr": 0.001}
    _, whole = split_done(tmp_path / "e.csv", read_done(tmp_path / "e.csv", keys), [point],
                          fixed)
    assert import_done(records, tmp_path / "e.csv", whole, fixed) == 1
    (key, (rows, config, _, finished)), = point_records(records, fixed, [point]).items()
    assert finished and key == "sigma=0.03_method=mi_backprop_lam=0.0_seed=0_K=2"
    df = results_frame([(rows, config, key, None)], "digits_grid", "digits",
                       {"sigma": "sigma"})
    assert set(df["status"]) == {"ok; " + note}
