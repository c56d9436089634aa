"""A piece of a grid (sweeps/piece.py): the next whole trials that fit a time budget, run
without Ray through the sweep's own trial loop and kept in the sweep's records, their rows in
the format `--done` and `python -m sweeps export` share; merged (or with --resume on the
records), the next piece moves on and no whole trial runs again."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from sweeps import piece
from sweeps.export_epochs import main as export
from tests.conftest import SMALL_NET

ROOT = Path(__file__).resolve().parents[1]
# A shortened quick preset: 4 trials (sigma .03 x lam {0, 1} x seeds {0, 1}) of one epoch.
GRID = ["--preset", "quick", "--epochs", "1", "--sigma", "0.03", "--lam", "0,1", "--seeds",
        "0,1", *SMALL_NET, "--mi-eval-steps", "20", "--device", "cpu"]
# What the test's costs say (not measured): a trial alone 3.2 s, a bundle of two 3.8 s
# (quick: 16 steps an epoch, one re-estimate a trial), with the 10% reserve 3.52 and 4.18 s.
COSTS = {"device": "test", "settings": {"batch_size": 256, "K": 40},
         "step_ms": {"fp32": {"1": 100.0, "2": 100.0}}, "setup_s": 1.0, "epoch_s": 0.1,
         "estimate_s": 0.5}


@pytest.fixture
def costs(tmp_path: Path) -> Path:
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(COSTS))
    return path


def _trials(csv: Path) -> set[tuple[float, int]]:
    rows = pd.read_csv(csv)
    assert (rows.groupby(["lam", "seed"])["epoch"].apply(sorted) == pd.Series(
        [[1]] * rows.groupby(["lam", "seed"]).ngroups,
        index=rows.groupby(["lam", "seed"]).size().index)).all()
    return {(float(lam), int(seed)) for lam, seed in rows[["lam", "seed"]].drop_duplicates()
            .itertuples(index=False)}


def test_costs_interpolate_and_bundles_fit_the_time_left():
    costs = piece.Costs("x", {}, {"p": {1: 20.1, 3: 34.5, 7: 68.7, 21: 168.5, 63: 533.0}},
                        setup_s=5.0, epoch_s=0.06, estimate_s=2.5)
    assert costs.step("p", 5) == pytest.approx(34.5 + (68.7 - 34.5) / 2)
    assert costs.largest("p") == 21  # the lowest cost a member: 63 costs each member more
    shape = piece.Shape(epochs=150, steps=59, estimates=(1, 11), precision="p")
    points = [{"lam": lam} for lam in (0.0, 0.5, 1.0)] * 7
    one = 5.0 + 150 * 59 * 20.1 / 1000 + 150 * 0.06 + 2.5  # an ERM trial alone
    assert shape.seconds(costs, points[:1]) == pytest.approx(one)
    four = 5.0 + 150 * 59 * costs.step("p", 4) / 1000 + 4 * 150 * 0.06 + (1 + 11 + 11 + 1) * 2.5
    assert shape.seconds(costs, points[:4]) == pytest.approx(four)
    assert piece.plan_size(points, four, shape, costs, 21) == 4
    assert piece.plan_size(points, four - 1, shape, costs, 21) == 3
    assert piece.plan_size(points, one - 1, shape, costs, 21) == 0
    assert piece.plan_size(points, 1e6, shape, costs, 21) == 21


@pytest.mark.slow
def test_pieces_run_the_next_whole_trials_and_never_one_again(tmp_path, costs, capsys):
    first, rows = tmp_path / "first", tmp_path / "rows.csv"
    # Without Ray (the device machine has none): `import ray` fails in this process.
    argv = [*GRID, "--costs", str(costs), "--budget", "6", "--out", str(first)]
    code = (f"import sys; sys.modules['ray'] = None; from sweeps.piece import main; "
            f"sys.exit(main({argv!r}))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # 6 s hold the bundle of two (4.18 s with its reserve) or a trial alone (3.52 s), not
    # all four: how many ran depends on this machine's speed, which trials does not.
    plan = json.loads((first / "piece.json").read_text())
    ran = sum(run["members"] for run in plan["runs"])
    assert 1 <= ran < 4 and "not started" in proc.stdout, proc.stdout
    for run in plan["runs"]:  # each started only with its estimate inside the time left
        assert run["estimate_s"] * (1 + run["reserve"]) <= run["left_s"], run
    order = [(0.0, 0), (1.0, 0), (0.0, 1), (1.0, 1)]  # seed 0 at every lambda first
    assert _trials(first / "epochs.csv") == set(order[:ran])
    written = pd.read_csv(first / "epochs.csv")
    assert set(written["status"]) == {"ok"} and set(written["precision"]) == {"fp32"}
    assert set(written["torch"]) == {torch.__version__}
    assert written["config"].map(lambda c: json.loads(c)["epochs"]).eq(1).all()

    assert export([str(first / "epochs.csv"), str(rows)]) == 0
    from sweeps.digits_grid import main as sweep

    # The first piece's OUT holds its trials' records where a sweep keeps them: --resume
    # goes on from them (none of its trials again), and a sweep resumed there finds them done.
    before = pd.read_csv(first / "epochs.csv")
    assert piece.main([*GRID, "--costs", str(costs), "--budget", "300", "--resume",
                       "--done", str(rows), "--out", str(first)]) == 0
    assert _trials(first / "epochs.csv") == set(order)
    after = pd.read_csv(first / "epochs.csv").set_index(["lam", "seed"])
    assert after.loc[before.set_index(["lam", "seed"]).index, "time_s"].tolist() == \
        before["time_s"].tolist()
    capsys.readouterr()
    assert sweep([*GRID, "--resume", "--dry-run", "--out", str(first)]) == 0
    assert "4 of 4 trials already finished" in capsys.readouterr().out

    second = tmp_path / "second"
    assert piece.main([*GRID, "--costs", str(costs), "--budget", "300", "--done", str(rows),
                       "--out", str(second)]) == 0
    assert _trials(second / "epochs.csv") == set(order[ran:])  # moved on, none again
    assert export([str(second / "epochs.csv"), str(rows)]) == 0
    assert _trials(rows) == set(order)
    capsys.readouterr()
    assert piece.main([*GRID, "--costs", str(costs), "--budget", "300", "--resume", "--done",
                       str(rows), "--out", str(second)]) == 0
    assert "every trial of the grid is whole" in capsys.readouterr().out

    # The sweep takes the merged rows as whole trials, and a third piece has nothing to run.
    assert sweep([*GRID, "--done", str(rows), "--dry-run", "--out", str(tmp_path / "s")]) == 0
    assert "4 of 4 trials finished" in capsys.readouterr().out
    assert piece.main([*GRID, "--costs", str(costs), "--budget", "300", "--done", str(rows),
                       "--out", str(tmp_path / "third")]) == 0
    assert "every trial of the grid is whole" in capsys.readouterr().out
    assert not (tmp_path / "third").exists()


def test_a_trial_that_cannot_finish_in_the_budget_is_not_started(tmp_path, costs, capsys):
    out = tmp_path / "out"
    assert piece.main([*GRID, "--costs", str(costs), "--budget", "3.4", "--out",
                       str(out)]) == 0
    assert "not started" in capsys.readouterr().out
    assert not (out / "epochs.csv").exists()


@pytest.mark.parametrize("extra, says", [
    (["--address", "auto"], "argument --address: a piece runs its trials in this process"),
    (["--bundle", "2"], "argument --bundle: a piece sizes its bundles itself"),
    (["--budget", "0"], "argument --budget: 0: must be > 0"),
    (["--K", "20"], "--costs: measured for another step: this piece has K=20 (costs: 40)"),
    (["--amp"], "--costs: no step measured at precision bf16-g"),
    (["--costs", "/nonexistent.json"], "--costs /nonexistent.json: cannot read it"),
    (["--warm-start"], "--warm-start (preset quick): a piece runs its trials without"),
])
def test_bad_input_is_one_error_line_before_anything_runs(tmp_path, costs, capsys, extra,
                                                          says):
    argv = [*GRID, "--costs", str(costs), "--budget", "60", "--out", str(tmp_path / "o"),
            *extra]
    with pytest.raises(SystemExit) as exc:
        piece.main(argv)
    assert exc.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert [text for text in lines if "error:" in text] == [lines[-1]]
    assert says in lines[-1], lines
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("kept", ["epochs.csv", "tune/digits_grid/trials/a_sweeps_trial/x"])
def test_an_earlier_runs_rows_and_records_are_not_overwritten(tmp_path, costs, capsys, kept):
    # A piece's rows, or a sweep's records (a piece given a sweep's OUT).
    out = tmp_path / "out"
    (out / kept).parent.mkdir(parents=True)
    (out / kept).write_text("kept\n")
    with pytest.raises(SystemExit) as exc:
        piece.main([*GRID, "--costs", str(costs), "--budget", "60", "--out", str(out)])
    assert exc.value.code == 2 and "--overwrite" in capsys.readouterr().err
    assert (out / kept).read_text() == "kept\n"


@pytest.mark.slow
def test_the_precision_check_writes_step_times_a_piece_reads(tmp_path):
    # bench/precision.py is what a lent GPU runs first (bench/gpu_pieces.sh measure): run on
    # the CPU at a toy size, it must write its report and step times a piece can read.
    costs = tmp_path / "costs.json"
    costs.write_text(json.dumps({**COSTS, "device": "CPU"}))
    proc = subprocess.run(
        [sys.executable, "bench/precision.py", "--device", "cpu", "--precisions",
         "fp32,bf16", "--B", "1,2", "--K", "2", "--batch-size", "32", "--steps", "1",
         "--repeats", "1", "--epochs", "1", "--slice-rows", "256", "--mi-eval-steps", "5",
         "--report", str(tmp_path), "--costs", str(costs)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    read = piece.Costs.read(costs)
    assert set(read.step_ms) == {"fp32", "bf16-g"}  # the test's own fp32 row replaced
    assert sorted(read.step_ms["bf16-g"]) == [1, 2] and read.step_ms["fp32"][1] != 100.0
    table = pd.read_csv(tmp_path / "precision_cpu.csv")
    slices = table[table["part"] == "slice"]
    assert sorted(slices["precision"]) == ["bf16-g", "fp32", "fp32"]  # fp32 twice: the spread
    assert (tmp_path / "precision_cpu.md").is_file()
