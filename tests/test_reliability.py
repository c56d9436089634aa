"""Sweeps survive crashes and kills, bad input gets one clear line, runs reproduce."""

from __future__ import annotations

import json
import math
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

from sweeps.ray_private import (
    TRIAL_DATA,
    name_saved_checkpoint,
    ray_temp_dir,
    saved_checkpoint_path,
    saved_trial_id,
    staging_dirs,
)
from tests.conftest import SMALL_NET, SMALL_NET_CONFIG
from tests.drivers import Ran, run_main, run_sweep
from tests.processes import alive, descendants
from tests.test_group_signal import check_no_ray_left_after_sigkill, ray_under

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

def test_unknown_benchmark_is_one_line():
    proc = run_main("__main__", "mnist-c")
    _one_line_error(proc, "unknown benchmark 'mnist-c'")


def test_data_root_that_does_not_exist(tmp_path):
    proc = _in_process("--root", str(tmp_path / "nowhere"), "--out", str(tmp_path / "out"))
    _one_line_error(proc, "--root")
    assert not (tmp_path / "out").exists() and not (tmp_path / "nowhere").exists()


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


def test_corrupt_german_file(tmp_path):
    bad = tmp_path / "german.data"
    bad.write_text("A11 6 A34\n")
    proc = run_sweep("german", "--root", str(bad), "--out", str(tmp_path / "o"))
    _one_line_error(proc, "line 1")
    assert not (tmp_path / "o").exists()


def test_unwritable_out(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    proc = _in_process("--out", str(blocker / "out"))
    _one_line_error(proc, "not writable")


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
    from trainables.digits import train_digits

    tuner = tune.Tuner(
        tune.with_resources(tune.with_parameters(train_digits, digits=digits), {"cpu": 1}),
        param_space=space,
        run_config=tune.RunConfig(name=name, storage_path=str(tmp_path), verbose=0),
    )
    return tuner.fit()


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
    grid = _fit(tmp_path, tiny_digits, space)
    df = results_frame(grid, "digits_grid", "digits",
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


# -- Tune's state cut off by a kill mid-copy ---------------------------------------------------

def _killed_experiment(storage: Path, staging_root: Path | None) -> dict[Path, bytes]:
    """A Tune experiment dir as a kill during Tune's copy of its files leaves it: the state
    cut in half, a trial's result.json emptied, another trial's (longer, from a later
    session) whole; and (when `staging_root`) the driver's whole staging copies. The layout
    is Tune's as sweeps/ray_private.py describes it (tests/test_ray_adapter.py checks it
    against a real run). Returns each file's whole content."""
    state = "experiment_state-2026-01-01_00-00-00.json"
    whole = {Path(state): json.dumps({"trial_data": [], "x": list(range(200))}).encode(),
             Path("trial_0/result.json"): b'{"epoch": 1}\n{"epoch": 2}\n',
             Path("trial_1/result.json"): b'{"epoch": 1}\n'}
    stored = {Path(state): whole[Path(state)][: len(whole[Path(state)]) // 2],
              Path("trial_0/result.json"): b"",
              Path("trial_1/result.json"): b'{"epoch": 1}\n{"epoch": 2}\n'}
    exp = storage / "digits_grid"
    for rel, data in stored.items():
        (exp / rel).parent.mkdir(parents=True, exist_ok=True)
        (exp / rel).write_bytes(data)
    (exp / "tuner.pkl").write_bytes(b"tuner")
    if staging_root is not None:
        staged = (staging_root / "session_1" / "artifacts" / "2026-01-01_00-00-00"
                  / "digits_grid" / "driver_artifacts")
        for rel, data in whole.items():
            (staged / rel).parent.mkdir(parents=True, exist_ok=True)
            (staged / rel).write_bytes(data)
        (staged / "trial_never_stored").mkdir()
        (staged / "trial_never_stored" / "result.json").write_bytes(b"{}\n")
        # Another sweep of the same driver (same experiment name, its own session).
        other = (staging_root / "session_2" / "artifacts" / "2026-02-02_00-00-00"
                 / "digits_grid" / "driver_artifacts")
        other.mkdir(parents=True)
        (other / "experiment_state-2026-02-02_00-00-00.json").write_bytes(b"{}")
        (other / "trial_0").mkdir()
        (other / "trial_0" / "result.json").write_bytes(b'{"epoch": 1}\n{"epoch": 2}\n{}\n')
    return {exp / rel: data for rel, data in whole.items()}


def test_files_cut_off_by_a_kill_are_put_back_from_the_staging_copies(tmp_path):
    from sweeps.tune_state import repair_cut_off_state

    storage, staging = tmp_path / "tune", tmp_path / "ray"
    whole = _killed_experiment(storage, staging)
    state, cut_result, longer_result = whole
    done = repair_cut_off_state(str(storage), ray_temp=staging)
    assert state.read_bytes() == whole[state] and cut_result.read_bytes() == whole[cut_result]
    # A stored file longer than the staged one is newer (a later session): left alone.
    assert longer_result.read_bytes() == b'{"epoch": 1}\n{"epoch": 2}\n'
    assert not (storage / "digits_grid" / "trial_never_stored").exists()
    assert not list((storage / "digits_grid").glob("*2026-02-02*"))  # not the other sweep's
    assert len(done) == 1 and "2 file(s)" in done[0]
    assert repair_cut_off_state(str(storage), ray_temp=staging) == []
    assert repair_cut_off_state("s3://bucket/sweep") == []


def test_resume_of_a_sweep_killed_before_tune_saved_state_starts_afresh(tmp_path):
    from sweeps.tune_state import saved_state

    state = next(iter(_killed_experiment(tmp_path / "tune", None)))
    assert saved_state(str(state.parent))
    state.unlink()  # killed in its first seconds: only tuner.pkl
    assert not saved_state(str(state.parent))


def test_state_cut_off_without_a_whole_copy_is_one_line_before_ray(tmp_path):
    out = tmp_path / "out"
    path = next(iter(_killed_experiment(out / "tune", None)))
    cut = path.read_bytes()
    # In this process, with RAY_TMPDIR a fresh directory (no staging copies to repair from);
    # a Ray started here would fail the test (tests/conftest.py: _no_ray_unless_marked).
    proc = _in_process(*TINY, "--out", str(out), "--resume")
    _one_line_error(proc, "is cut off")
    assert "--overwrite" in proc.stderr
    assert path.read_bytes() == cut


# -- a driver killed mid-sweep continues with --resume ----------------------------------------

@pytest.mark.system
def test_a_sigkilled_sweep_leaves_no_ray_and_resumes_without_rerunning_finished_trials(
        ray_local, tmp_path, checked_at_the_end):
    """SIGKILL to the driver's process group once one trial has finished and the other, a
    bundle of two grid points (--bundle, trainables/bundle.py), is in its third epoch with its
    second's checkpoint named in Tune's state; that state then made to name the bundle's
    deleted first checkpoint, as a kill right after Tune deleted it leaves it, and Tune's files
    in OUT cut as a kill in the middle of Tune's copy leaves them. No process of its Ray is
    left, and --resume puts the files back, names the checkpoint on disk, leaves the finished
    trial alone and continues the bundle's members from their checkpoint."""
    out = tmp_path / "out"
    # [lam 0 and 0.5 in one trial, lam 1 alone]: the bundle trains two nets an epoch, so the
    # plain trial, started beside it, finishes first.
    args = [*TINY, "--lam", "0,0.5,1", "--epochs", "3", "--bundle", "2", "--inner-z", "batch",
            "--out", str(out)]
    experiment = out / "tune" / "digits_grid"

    def bundle_checkpointed_epoch_2() -> bool:
        # Epoch 2's checkpoint on disk and in Tune's state: the members then go on from it.
        for path in experiment.glob("experiment_state-*.json"):
            try:
                trials = json.loads(path.read_text())["trial_data"]
            except (OSError, ValueError, KeyError):
                continue  # being written
            if any(json.loads(t[0])["trial_id"].endswith("_00000")
                   and "checkpoint_000001" in t[1] for t in trials):
                return True
        return False

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
        while not bundle_checkpointed_epoch_2():
            assert time.time() < deadline, "Tune's state never named the bundle's epoch 2"
            time.sleep(0.1)
        ray, session = ray_under(proc.pid)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the driver's process group
        proc.wait(timeout=60)
    check_no_ray_left_after_sigkill(ray, session, time.time(), checked_at_the_end)
    assert not (out / "results.parquet").exists()
    # A kill between Tune deleting a checkpoint and saving the state that names the next one
    # (MEASURED, "Trial bundles") left such a state once in 5 kills: make it so every time,
    # in OUT and in the driver's staging copies, by naming the bundle's deleted epoch-1
    # checkpoint. --resume must go on from the checkpoint on disk instead.
    own = {p.name for p in experiment.glob("experiment_state-*.json")}
    states = [*experiment.glob("experiment_state-*.json"),
              *(p for d in staging_dirs(ray_temp_dir(), experiment.name)
                for p in d.glob("experiment_state-*.json") if p.name in own)]
    for path in states:
        state = json.loads(path.read_text())
        for entry in state[TRIAL_DATA]:
            named = saved_checkpoint_path(entry)
            if saved_trial_id(entry).endswith("_00000") and named:
                deleted = str(Path(named).with_name("checkpoint_000000"))
                assert not Path(deleted).exists()
                name_saved_checkpoint(entry, deleted, {"training_iteration": 1,
                                                       "checkpoint_dir_name": "checkpoint_000000"})
        path.write_text(json.dumps(state))
    # Where the kill lands in Tune's copy of its files into OUT/tune varies (CI once caught
    # it mid-copy); make it the worst case every time: the state and every result.json cut.
    cut = [*experiment.glob("experiment_state-*.json"), *experiment.glob("*/result.json")]
    assert len(cut) >= 2
    for path in cut:
        path.write_bytes(path.read_bytes()[:10])

    resumed = _in_process(*args, "--resume")
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert re.search(r"resume: put back Tune's whole staging copies of \d+ file\(s\)",
                     resumed.stdout)
    assert re.search(r"naming a deleted checkpoint; \S+_00000_\S+: checkpoint_000000, deleted, "
                     r"-> checkpoint_00000[12]", resumed.stdout), resumed.stdout[-2000:]
    assert "resume: 1 of 2 trials already finished" in resumed.stdout, resumed.stdout[-2000:]
    reran = [ln for ln in resumed.stdout.splitlines() if finished_first[0] + ":" in ln]
    assert not reran, f"finished trial ran again: {reran}"
    df = pd.read_parquet(out / "results.parquet")
    assert df["trial_id"].nunique() == 3 and (df["status"] == "ok").all()
    assert all(sorted(e) == [1, 2, 3] for _, e in df.groupby("trial_id")["epoch"])
    assert (out / "table.md").exists()
    # The bundle's members went on from epoch 2's checkpoint, not afresh; that a restart from
    # a checkpoint's bytes continues every member exactly is test_run_trial.py's
    # test_a_restarted_bundle_continues_exactly (the bytes Tune's adapter stores).
    members = df[df["lam"] < 1]
    assert set(members.loc[members["epoch"] == 3, "start_epoch"]) == {3}
    assert set(members.loc[members["epoch"] <= 2, "start_epoch"]) == {1}
    assert set(df.loc[df["lam"] == 1, "start_epoch"]) == {1}


# -- a driver stopped by Ctrl-C (test_done.py's stopped grid, which resumes it) or a SIGTERM to
# its process group (test_group_signal.py) takes its trials and its Ray with it; the checks
# are stop_driver and check_stopped above.

def test_waiting_trials_start_in_the_grids_order_whatever_order_tune_lists_them():
    from types import SimpleNamespace

    from ray.tune.experiment import Trial

    from sweeps.scheduling import GridOrderScheduler

    def trial(number: int, status: str) -> SimpleNamespace:
        return SimpleNamespace(trial_id=f"1f693_{number:05d}", status=status,
                               config={"point": {"seed": 0}})

    # a restored trial list: a dict's order, the running ones first
    trials = [trial(1, Trial.RUNNING), trial(83, Trial.PENDING), trial(26, Trial.PENDING),
              trial(2, Trial.TERMINATED), trial(3, Trial.PENDING), trial(4, Trial.PAUSED)]
    controller = SimpleNamespace(get_trials=lambda: trials)
    scheduler = GridOrderScheduler()
    assert scheduler.choose_trial_to_run(controller).trial_id == "1f693_00003"
    for t in trials:
        if t.status == Trial.PENDING:
            t.status = Trial.TERMINATED
    assert scheduler.choose_trial_to_run(controller).trial_id == "1f693_00004"  # then paused
    trials[-1].status = Trial.TERMINATED
    assert scheduler.choose_trial_to_run(controller) is None


def test_saved_trials_are_put_back_in_the_grids_order(tmp_path):
    from sweeps.tune_state import order_saved_trials

    def saved(number: int) -> list[str]:
        return [json.dumps({"trial_id": f"1f693_{number:05d}", "config": {"n": number}}),
                json.dumps({"last_result_time": -math.inf})]

    state = {"trial_data": [saved(n) for n in (0, 59, 19, 6, 104, 1)],
             "runner_data": {"x": 1}, "stats": {"start_time": 12.5}}
    path = tmp_path / "experiment_state-2026-11-25_17-03-27.json"
    path.write_text(json.dumps(state))
    other = tmp_path / "experiment_state-2026-11-25_17-04-00.json"
    other.write_text('{"not": "a state of this form"}')
    assert order_saved_trials(str(tmp_path))
    after = json.loads(path.read_text())
    assert [json.loads(t[0])["trial_id"][-3:] for t in after["trial_data"]] == [
        "000", "001", "006", "019", "059", "104"]
    assert after["trial_data"][2] == saved(6)  # each entry as Tune wrote it
    assert {k: after[k] for k in ("runner_data", "stats")} == {
        "runner_data": {"x": 1}, "stats": {"start_time": 12.5}}
    assert other.read_text() == '{"not": "a state of this form"}'
    assert not order_saved_trials(str(tmp_path))  # already in order: nothing rewritten


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

    # a resumed run: two trials finished before the stop, one errored for good
    trials = [trial(0, Trial.TERMINATED), trial(1, Trial.TERMINATED), trial(2, Trial.ERROR),
              trial(3, Trial.RUNNING), trial(4, Trial.PENDING)]
    progress = progress_callback(("seed",), 5)
    progress.on_trial_complete(0, trials, trials[3])
    assert "finished 3/5: seed=3" in capsys.readouterr().out


def test_a_trial_that_never_reported_is_not_counted_as_finished():
    from types import SimpleNamespace

    from sweeps.results_frame import finished

    never = SimpleNamespace(error=None, metrics={"trial_id": "a"}, config=None)
    half = SimpleNamespace(error=None, metrics={"epoch": 1}, config={"epochs": 3})
    done = SimpleNamespace(error=None, metrics={"epoch": 3}, config={"epochs": 3})
    assert [finished(r) for r in (never, half, done)] == [False, False, True]
