"""Sweeps survive crashes and kills, bad input gets one clear line, runs reproduce."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
from ray import tune

from tests.conftest import SMALL_NET, SMALL_NET_CONFIG
from tests.drivers import Ran, run_main, run_sweep
from tests.processes import alive, descendants
from tests.test_group_signal import check_no_ray_left_after_sigkill, ray_under
from trainables.record import records_root
from unbiased.settings import RECORDS_KEY

ROOT = Path(__file__).resolve().parents[1]
DRIVER = ROOT / "sweeps" / "digits_grid.py"
# Its trials check the sweep machinery, not learning: the small net (tests/conftest.py).
TINY = ["--sigma", "0.03", "--seeds", "0", "--K", "2", "--batch-size", "256",
        "--mi-eval-steps", "20", "--device", "cpu", "--cpus-per-trial", "1", *SMALL_NET]


def _in_process(*args: str) -> Ran:
    """The digits driver in this process (tests/drivers.py): its checks before Ray, or, in a
    test with the `ray_local` fixture, a whole sweep on the session's Ray (no Python or Ray
    start of its own: ~20 s of CPU saved a run). Stops by signal stay processes."""
    return run_main("digits_grid", *args)


def _start_driver(args: list[str]) -> subprocess.Popen:
    """The digits driver in a session of its own, its output line by line."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, str(DRIVER), *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


@dataclass
class Stopped:
    """A driver stopped by a signal: its exit status, its output after the line waited for,
    and the processes under it when the signal came (its Ray)."""

    returncode: int
    rest: str
    ray_processes: dict[int, str]


def stop_driver(args: list[str], signum: int, needle: str) -> Stopped:
    """Start the driver, send it `signum` once a line holding `needle` came (a trial is
    training once it has reported an epoch)."""
    proc = _start_driver(args)
    try:
        deadline = time.time() + 300
        for line in proc.stdout:
            if needle in line:
                break
            assert time.time() < deadline, f"no {needle!r} in time"
        ray_processes = descendants(proc.pid)
        workers = [p for p in ray_processes
                   if "ImplicitFunc" in Path(f"/proc/{p}/cmdline").read_text(errors="replace")]
        assert workers, "no trial worker found under the driver"
        proc.send_signal(signum)
        rest = proc.stdout.read()
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return Stopped(proc.returncode, rest, ray_processes)


def check_stopped(stopped: Stopped, signum: int, out: Path) -> None:
    """What a sweep stopped by SIGTERM or Ctrl-C leaves: exit 128 + signal, no traceback, no
    list of the unstarted trials, the `--resume` line last, no process of its Ray, nothing
    half-analysed."""
    rest = stopped.rest
    assert stopped.returncode == 128 + signum, rest[-2000:]
    assert "Traceback" not in rest, rest[-3000:]
    assert "Failed to fetch metrics" not in rest  # Tune's list of the unstarted trials
    last = rest.strip().splitlines()[-1]
    assert last.startswith(f"stopped by {signal.Signals(signum).name}") and "--resume" in last
    deadline = time.time() + 15
    while time.time() < deadline and any(alive(p, s) for p, s in stopped.ray_processes.items()):
        time.sleep(0.5)
    left = [p for p, s in stopped.ray_processes.items() if alive(p, s)]
    assert not left, f"processes of the sweep's Ray still running: {left}"
    assert not (out / "results.parquet").exists()  # stopped: nothing half-analysed


def _one_line_error(proc: Ran | subprocess.CompletedProcess, needle: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert needle in proc.stderr.strip().splitlines()[-1]


# -- bad input: one line, exit 2, nothing written ---------------------------------------------

@pytest.mark.ray
def test_unknown_benchmark_is_one_line():
    proc = run_main("__main__", "mnist-c")
    _one_line_error(proc, "unknown benchmark 'mnist-c'")


@pytest.mark.ray
def test_data_root_that_does_not_exist(tmp_path):
    proc = _in_process("--root", str(tmp_path / "nowhere"), "--out", str(tmp_path / "out"))
    _one_line_error(proc, "--root")
    assert not (tmp_path / "out").exists() and not (tmp_path / "nowhere").exists()


@pytest.mark.ray
def test_corrupt_mnist_files(tmp_path):
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for name in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                 "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"):
        (raw / name).write_bytes(b"not an idx file")
    # On the CPU: without CUDA the paper preset's GPU would be refused first.
    proc = _in_process("--preset", "paper", "--device", "cpu", "--gpus-per-trial", "0", "--root",
                   str(tmp_path), "--out", str(tmp_path / "o"))
    _one_line_error(proc, "MNIST")
    assert not (tmp_path / "o").exists()


@pytest.mark.ray
def test_corrupt_german_file(tmp_path):
    bad = tmp_path / "german.data"
    bad.write_text("A11 6 A34\n")
    proc = run_sweep("german", "--root", str(bad), "--out", str(tmp_path / "o"))
    _one_line_error(proc, "line 1")
    assert not (tmp_path / "o").exists()


@pytest.mark.ray
def test_unwritable_out(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    proc = _in_process("--out", str(blocker / "out"))
    _one_line_error(proc, "not writable")


@pytest.mark.ray
def test_results_of_another_experiment_are_refused_even_with_resume(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    marker = out / "experiment.json"
    marker.write_text(json.dumps({"experiment": "german_grid"}))
    _one_line_error(_in_process("--out", str(out)), "--resume")
    _one_line_error(_in_process("--out", str(out), "--resume"), "german_grid")
    assert json.loads(marker.read_text()) == {"experiment": "german_grid"}
    assert sorted(p.name for p in out.iterdir()) == ["experiment.json"]


# -- divergence, reproducibility, provenance --------------------------------------------------

def _digits_config(**over):
    config = {"sigma": 0.03, "lam": 1.0, "K": 2, "seed": 0, "epochs": 2, "batch_size": 64,
              "lr": 1e-3, "mine_lr": 1e-3, "inner_z": "batch", "device": "cpu",
              "num_threads": 1, "mi_eval_steps": 20}
    config.update(over)
    return config


def _fit(tmp_path, digits, space, name="t"):
    from trainables.tune_trial import trainable_for

    tuner = tune.Tuner(
        tune.with_resources(tune.with_parameters(trainable_for("digits"), digits=digits),
                            {"cpu": 1}),
        param_space={**space, RECORDS_KEY: records_root(str(tmp_path), name)},
        run_config=tune.RunConfig(name=name, storage_path=str(tmp_path), verbose=0),
    )
    return tuner.fit()


@pytest.mark.ray
def test_diverging_trial_stops_itself_and_analysis_leaves_it_out(ray_local, tiny_digits,
                                                                  tmp_path):
    from analysis import build_all
    from sweeps.cli import SweepArgs
    from sweeps.outputs import write_outputs
    from sweeps.results_frame import results_frame

    # SGD at lr 1e6 on the statistics network overflows to NaN in the first epoch: a real
    # divergence from a bad hyper-parameter, next to a trial that trains normally.
    space = _digits_config(epochs=3, mine_optimizer="sgd",
                           mine_lr=tune.grid_search([1e-3, 1e6]), **SMALL_NET_CONFIG)
    from unbiased.settings import flat_config

    grid = _fit(tmp_path, tiny_digits, space)
    df = results_frame([(r.metrics_dataframe, flat_config(r.config), str(i), r.error)
                        for i, r in enumerate(grid)], "digits_grid", "digits",
                       {"sigma": "sigma", "lam": "lam", "K": "K", "seed": "seed",
                        "epochs": "epochs"})
    configs = df["config"].map(json.loads)
    bad = df[configs.map(lambda c: c["mine_lr"]) == 1e6]
    good = df[configs.map(lambda c: c["mine_lr"]) == 1e-3]
    assert list(bad["epoch"]) == [1]  # stopped itself after the first epoch
    assert bad["status"].iloc[0].startswith("diverged at epoch 1")
    assert list(good["epoch"]) == [1, 2, 3] and (good["status"] == "ok").all()

    out = tmp_path / "out"
    args = SweepArgs(benchmark="digits", preset="quick", values={"lam": [1.0]}, out=out)
    write_outputs(args, "digits_grid", df)
    table = (out / "table.md").read_text()
    assert "diverged at epoch 1" in table
    # The diverged trial is listed but not averaged: every mean cell has n = 1.
    tidy = pd.read_parquet(out / "table.parquet")
    ours = tidy[(tidy["source"] == "ours") & tidy["n"].notna()]
    assert len(ours) and (ours["n"] <= 1).all()
    assert build_all(out)  # rebuilding from the file alone works too

    # Provenance: versions, commit and every trial's full config travel with the results.
    meta = json.loads(pq.read_schema(out / "results.parquet").metadata[b"unbiased.experiment"])
    assert meta["versions"]["torch"] and meta["versions"]["ray"] and meta["git_commit"]
    saved = pd.read_parquet(out / "results.parquet")
    assert {json.loads(c)["mine_lr"] for c in saved["config"]} == {1e-3, 1e6}


def test_same_config_and_seed_give_identical_metrics(tiny_digits):
    # In-process (tests/trials.py); under Tune every trial runs the same run_trial.
    from tests.trials import run_recorded

    runs = []
    for _ in range(2):
        result = run_recorded("digits", _digits_config(), digits=tiny_digits)
        assert result.error is None
        runs.append(result.reports)
    cols = ["epoch", "mi", "train_acc", "test_acc", "loss_task", "mi_batch", "mi_eval"]
    pd.testing.assert_frame_equal(runs[0][cols], runs[1][cols])


# -- atomic writes ----------------------------------------------------------------------------

def test_killed_writer_leaves_the_old_file_intact(tmp_path):
    target = tmp_path / "table.md"
    target.write_text("the good table\n")
    # The writer writes half a file, then hangs; we SIGKILL it midway.
    script = (
        "import sys, time\n"
        "from analysis.io import atomic_write\n"
        "def writer(tmp):\n"
        "    with open(tmp, 'w') as fh:\n"
        "        fh.write('half a tab'); fh.flush()\n"
        "        print('writing', flush=True); time.sleep(60)\n"
        f"atomic_write({str(target)!r}, writer)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "writing"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert target.read_text() == "the good table\n"
    leftovers = [p for p in tmp_path.iterdir() if p.name != "table.md"]
    assert all(p.name.startswith(".table.md.") for p in leftovers)  # hidden temp, not target


# -- a record cut by a kill: trainables/record.py's own tests (tests/test_records.py) ---------

@pytest.mark.ray
def test_a_record_of_another_grid_is_one_line_before_ray(tmp_path):
    # A record left by a sweep of other settings (a checkpoint of another lr cannot go on
    # under this one's): --resume refuses in one line, before Ray starts (a Ray started here
    # fails the test: tests/conftest.py, _no_ray_unless_marked), and leaves it as it was.
    from trainables.record import RecordStore

    out = tmp_path / "out"
    records = RecordStore.at(str(out / "tune"), "digits_grid")
    point = {"sigma": 0.03, "method": "mi_backprop", "lam": 0.0, "seed": 0, "K": 2}
    key = "sigma=0.03_method=mi_backprop_lam=0.0_seed=0_K=2"
    records.start(key, {**point, "epochs": 8, "lr": 0.5, "batch_size": 256})
    records.write(key, [{"epoch": 1}], {"state.pt": b"x"})
    (out / "experiment.json").write_text(json.dumps({"experiment": "digits_grid"}))
    proc = _in_process(*TINY, "--out", str(out), "--resume")
    _one_line_error(proc, f"the record of trial {key}: trial")
    assert "ran with lr=0.5" in proc.stderr
    assert records.checkpoint(records.read(key)) == {"state.pt": b"x"}


# -- a driver killed mid-sweep continues with --resume ----------------------------------------

@pytest.mark.ray
@pytest.mark.system
def test_a_sigkilled_sweep_leaves_no_ray_and_resumes_without_rerunning_finished_trials(
        ray_local, tmp_path, checked_at_the_end):
    """SIGKILL to the driver's process group once one trial has finished and the other, a
    bundle of two grid points (--bundle, unbiased/trial.py), has its second epoch's
    checkpoint in its record (trainables/record.py); the record then made as a kill in the
    middle of the third epoch's write leaves it (part of that checkpoint's files, a
    half-written temporary file). No process of its Ray is left, and --resume leaves the
    finished trial alone and continues the bundle's members from their checkpoint."""
    from trainables.record import RecordStore

    out = tmp_path / "out"
    # [lam 0 and 0.5 in one trial, lam 1 alone]: the bundle trains two nets an epoch, so the
    # plain trial, started beside it, finishes first.
    args = [*TINY, "--lam", "0,0.5,1", "--epochs", "3", "--bundle", "2", "--inner-z", "batch",
            "--out", str(out)]
    records = RecordStore.at(str(out / "tune"), "digits_grid")
    bundle = "sigma=0.03_method=mi_backprop_lam=0.0_seed=0_K=2+1"

    def bundle_epochs() -> int:
        record = records.read(bundle) if (out / "tune").is_dir() else None
        return 0 if record is None else len(record.rows)

    proc = _start_driver(args)
    finished_first: list[str] = []
    deadline = time.time() + 300
    try:
        for line in proc.stdout:
            if re.search(r"finished \d+/\d+: ", line):
                finished_first.append(line.split(": ", 1)[1].strip())
                break
            assert time.time() < deadline, "no trial finished in time"
        assert finished_first == ["method=mi_backprop sigma=0.03 lam=1.0 K=2 seed=0"], (
            finished_first)
        while bundle_epochs() < 2:
            assert time.time() < deadline, "the bundle's record never held epoch 2"
            time.sleep(0.05)
        ray, session = ray_under(proc.pid)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the driver's process group
        proc.wait(timeout=60)
    check_no_ray_left_after_sigkill(ray, session, time.time(), checked_at_the_end)
    assert not (out / "results.parquet").exists()
    kept = bundle_epochs()  # 2, or 3 where the bundle wrote its last epoch before the kill
    assert kept in (2, 3)
    trial_dir = out / "tune" / "digits_grid" / "trials" / bundle
    if kept == 2:  # a kill in the middle of epoch 3's write, every time
        (trial_dir / "checkpoint" / "000003").mkdir()
        (trial_dir / "checkpoint" / "000003" / "state_m0.pt").write_bytes(b"half")
    (trial_dir / "epochs.jsonl.1a2b3c4d.tmp").write_bytes(b'{"epoch": ')

    resumed = _in_process(*args, "--resume")
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert "resume: 1 of 3 trials already finished" in resumed.stdout, resumed.stdout[-2000:]
    reran = [ln for ln in resumed.stdout.splitlines() if finished_first[0] + ":" in ln]
    assert not reran, f"finished trial ran again: {reran}"
    df = pd.read_parquet(out / "results.parquet")
    assert df["trial_id"].nunique() == 3 and (df["status"] == "ok").all()
    assert all(sorted(e) == [1, 2, 3] for _, e in df.groupby("trial_id")["epoch"])
    assert (out / "table.md").exists()
    # The bundle's members went on from their last checkpoint, not afresh; that a restart
    # from a checkpoint's bytes continues every member exactly is test_run_trial.py's
    # test_a_restarted_bundle_continues_exactly.
    members = df[df["lam"] < 1]
    assert set(members.loc[members["epoch"] > kept, "start_epoch"]) <= {kept + 1}
    assert set(members.loc[members["epoch"] <= kept, "start_epoch"]) == {1}
    assert set(df.loc[df["lam"] == 1, "start_epoch"]) == {1}
    assert [p.name for p in (trial_dir / "checkpoint").iterdir()] == ["000003"]


# -- a driver stopped by Ctrl-C (test_finished_trials.py's stopped grid, which resumes it) or a
# SIGTERM to its process group (test_group_signal.py) takes its trials and its Ray with it; the
# checks are stop_driver and check_stopped above.

def test_tunes_list_of_unstarted_trials_is_dropped_once_a_stop_came():
    import logging
    from types import SimpleNamespace

    from sweeps.signals import QuietUnstarted, StopSignals

    def record(message: str) -> logging.LogRecord:
        return logging.LogRecord(QuietUnstarted.LOGGER, logging.WARNING, __file__, 1, message,
                                 None, None)

    logger = logging.getLogger(QuietUnstarted.LOGGER)
    unstarted = record("Failed to fetch metrics for 2 trial(s):\n- a\n- b")
    other = record("something else")
    with StopSignals(SimpleNamespace(out="OUT")) as stop:  # type: ignore[arg-type]
        assert logger.filter(unstarted) and logger.filter(other)  # still running: all shown
        stop.received = signal.SIGTERM
        assert not logger.filter(unstarted) and logger.filter(other)
    assert logger.filter(unstarted)  # the filter leaves with the sweep
    with QuietUnstarted():  # a resume reading the saved state: always quiet
        assert not logger.filter(unstarted) and logger.filter(other)


def test_progress_counts_the_trials_earlier_runs_finished(capsys):
    from types import SimpleNamespace

    from ray.tune.experiment import Trial

    from sweeps.runner import progress_callback

    def trial(seed: int, status: str) -> SimpleNamespace:
        return SimpleNamespace(config={"point": {"seed": seed}}, status=status,
                               TERMINATED=Trial.TERMINATED)

    # a resumed run: two trials finished in earlier launches, of this one's three one
    # errored for good
    trials = [trial(2, Trial.ERROR), trial(3, Trial.RUNNING), trial(4, Trial.PENDING)]
    progress = progress_callback(("seed",), 5, n_done=2)
    progress.on_trial_complete(0, trials, trials[1])
    assert "finished 3/5: seed=3" in capsys.readouterr().out


def test_a_trial_that_never_reported_is_not_counted_as_finished():
    from types import SimpleNamespace

    from sweeps.results_frame import finished

    never = SimpleNamespace(error=None, metrics={"trial_id": "a"}, config=None)
    half = SimpleNamespace(error=None, metrics={"epoch": 1}, config={"epochs": 3})
    done = SimpleNamespace(error=None, metrics={"epoch": 3}, config={"epochs": 3})
    assert [finished(r) for r in (never, half, done)] == [False, False, True]


@pytest.mark.ray
@pytest.mark.parametrize("held", ["nothing", "an empty folder", "tune's state alone"])
def test_resuming_where_no_sweep_was_launched_is_one_line_before_ray(tmp_path, held):
    # A mistyped --out, or a sweep from before trials kept records: nothing to continue.
    out = tmp_path / "out"
    if held != "nothing":
        out.mkdir()
    if held == "tune's state alone":
        (out / "tune" / "digits_grid").mkdir(parents=True)
        (out / "tune" / "digits_grid" / "experiment_state-2026-11-28.json").write_text("{}")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    proc = _in_process(*TINY, "--out", str(out), "--resume")
    _one_line_error(proc, f"cannot resume {out}: it holds no sweep")
    assert f"python -m sweeps export {out} CSV" in proc.stderr
    assert proc.stdout == ""  # before the data's load and the start line, so before Ray
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


@pytest.mark.ray
def test_a_sweep_launched_but_stopped_before_any_report_resumes(tmp_path):
    from trainables.record import RecordStore

    out = tmp_path / "out"
    RecordStore.at(str(out / "tune"), "digits_grid").begin()
    proc = _in_process(*TINY, "--lam", "0,1", "--out", str(out), "--resume", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "resume: 0 of 2 trials already finished" in proc.stdout
