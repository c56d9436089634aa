"""slurm/sweep.sbatch's jobs beside the walltime scenario (tests/test_slurm.py), on a real
Slurm started here whose nodes have 2 CPUs and 2 GPUs as GRES each (tests/slurm_cluster.py):

- a sweep given GPUs (`--gres=gpu:2`) places its trials on both nodes' GPUs;
- trials asking GPUs the job lacks are refused at once, and so is a job whose torch cannot
  see the GPUs Slurm gave (no requeue);
- two jobs started together on one node take port blocks that do not overlap, and another
  user's job after a root job on a node starts its Ray too;
- a node whose Ray cannot start stops the job, naming it;
- a plain `scancel` ends the job well before Slurm's KillWait;
- a sweep whose trials all finished, or that makes no progress, is not requeued again.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import SMALL_NET
from tests.processes import stop_group, with_text
from tests.slurm_cluster import NODES, ROOT, Slurm, slurm_fixture  # noqa: F401 (`slurm`)
from tests.test_slurm import FINAL, SCRIPT, _until

pytestmark = [pytest.mark.ray, pytest.mark.system, pytest.mark.slow]

SWEEP = ["sweeps/digits_grid.py", "--sigma", "0.03", "--lam", "0,1", "--seeds", "0", "--K", "2",
         "--batch-size", "256", "--mi-eval-steps", "20", *SMALL_NET]
KILL_WAIT_S = 30  # Slurm's default KillWait: a cancelled job's processes are SIGKILLed then


def _ended(slurm: Slurm, *jobs: str) -> bool:
    return all(slurm.job(job)["JobState"] in FINAL for job in jobs)


def _logs(slurm: Slurm, *logs: Path) -> list[Path]:
    return [*logs, slurm.home / "log" / "slurmctld.log"]


def test_a_gpu_sweep_places_its_trials_on_both_nodes_gpus(slurm, tmp_path):
    out, log = tmp_path / "out", tmp_path / "gpu.log"
    # --device cpu: the GPUs are Slurm's fake ones; Ray counts and hands them out all the same.
    # A trial takes a node's 2 CPUs: one trial a node, so both nodes run one.
    job = slurm.sbatch(log, "--gres=gpu:2", "--cpus-per-task=2", "--time=10", str(SCRIPT),
                       *SWEEP, "--device", "cpu", "--cpus-per-trial", "2",
                       "--gpus-per-trial", "0.5", "--epochs", "2", "--out", str(out))
    _until(lambda: _ended(slurm, job), "the GPU sweep ends", 300, _logs(slurm, log))
    info, text = slurm.job(job), log.read_text()
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", text[-3000:]
    # each node's Ray counted the 2 GPUs Slurm gave the job there
    assert re.search(r"Ray at \S+: n1 has 2 CPUs and 2 GPUs, n2 has 2 CPUs and 2 GPUs", text), \
        text[-3000:]
    assert "torch" not in text.split("Ray head on")[1].split("Ray at")[0]  # no GPU check
    df = pd.read_parquet(out / "results.parquet")
    assert (df["status"] == "ok").all() and len(df) == 4, df
    assert set(df["node"]) == set(NODES), df[["lam", "epoch", "node"]]


def _refused_once(slurm: Slurm, job: str, log: Path) -> str:
    """The one `error:` line of a job that failed with the driver's 2 and was not requeued."""
    info, text = slurm.job(job), log.read_text()
    assert info["JobState"] == "FAILED" and info["ExitCode"] == "2:0", text[-3000:]
    assert info["Restarts"] == "0"
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, text[-3000:]
    return errors[0]


def test_trials_asking_gpus_the_job_lacks_are_refused_at_once(slurm, tmp_path):
    log = tmp_path / "refused.log"
    started = time.monotonic()
    job = slurm.sbatch(log, "--time=10", str(SCRIPT), *SWEEP, "--gpus-per-trial", "1",
                       "--epochs", "2", "--out", str(tmp_path / "out"))
    _until(lambda: _ended(slurm, job), "the refused job ends", 120, _logs(slurm, log))
    took = time.monotonic() - started
    error, text = _refused_once(slurm, job, log), log.read_text()
    assert error.startswith("error: each trial asks 1 CPU and 1 GPU (--cpus-per-trial 1 "
                                "--gpus-per-trial 1), and no node of the Ray at")
    assert "n1 has 1 CPU and 0 GPUs, n2 has 1 CPU and 0 GPUs" in error
    assert "sbatch --gres=gpu:N or --gpus-per-node=N" in error
    assert "epoch 1/" not in text and not (tmp_path / "out" / "tune").exists()
    assert took < 90, took  # a minute, with the job's start and Ray's


def test_a_job_whose_torch_sees_none_of_its_gpus_stops_at_its_start(slurm, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("torch sees a real GPU here: Slurm's fake GPU 0 would be it")
    log = tmp_path / "nogpu.log"
    # 2 GPUs and the 1 CPU a job gets without --cpus-per-task
    job = slurm.sbatch(log, "--gres=gpu:2", "--time=10", str(SCRIPT), *SWEEP,
                       "--epochs", "1", "--out", str(tmp_path / "out"), nodes=1)
    _until(lambda: _ended(slurm, job), "the job ends", 120, _logs(slurm, log))
    info, text = slurm.job(job), log.read_text()
    assert info["JobState"] == "FAILED" and info["ExitCode"] == "2:0", text[-3000:]
    assert ("sweep.sbatch: n1 has 2 GPUs and 1 CPU: each trial takes a CPU at least, so at "
            "most 1 GPUs are used at a time (sbatch --cpus-per-task=2 or more)") in text
    error = next(line for line in text.splitlines() if line.startswith("error:"))
    build = f"a CUDA {torch.version.cuda} build" if torch.version.cuda else "a CPU-only build"
    assert error.startswith(f"error: n1: Slurm gave this job 2 GPUs here, torch "
                            f"{torch.__version__} ({build}) sees 0; NVIDIA driver: "), error
    assert "TORCH_CUDA=" in error
    assert "ray_node: head" not in text  # stopped before Ray started


def test_two_jobs_started_together_on_one_node_take_ports_that_do_not_overlap(slurm,
                                                                            tmp_path):
    logs = [tmp_path / "p1.log", tmp_path / "p2.log"]
    jobs = [slurm.sbatch(log, "-w", "n2", "--mem=500", "--time=5", str(SCRIPT),
                         "sweeps/digits_grid.py", "--dry-run", nodes=1) for log in logs]
    _until(lambda: _ended(slurm, *jobs), "both jobs end", 120, _logs(slurm, *logs))
    ranges = []
    for job, log in zip(jobs, logs, strict=True):
        assert slurm.job(job)["ExitCode"] == "0:0", log.read_text()[-3000:]
        (first, last), = re.findall(r"ray_node: head on n2, ports (\d+)-(\d+)", log.read_text())
        ranges.append(range(int(first), int(last) + 1))
    starts = {slurm.job(job)["StartTime"] for job in jobs}
    print(f"start times {sorted(starts)}, port ranges {ranges}")
    assert not set(ranges[0]) & set(ranges[1]), ranges
    for r in ranges:  # outside Ray's default worker ports and Linux's ephemeral ones
        assert r.start >= 20000 and r.stop <= 32768, r


def test_a_cancelled_sweep_ends_well_before_slurms_killwait(slurm, tmp_path):
    out, log = tmp_path / "out", tmp_path / "cancel.log"
    job = slurm.sbatch(log, "--time=10", str(SCRIPT), *SWEEP, "--device", "cpu",
                       "--epochs", "200", "--out", str(out))
    _until(lambda: any(out.glob("tune/digits_grid/trials/*/checkpoint/*")), "a checkpoint", 300,
           _logs(slurm, log))
    cancelled = time.monotonic()
    slurm.run("scancel", job)  # every process of the job, Ray's GCS among them, gets SIGTERM
    _until(lambda: _ended(slurm, job), "the cancelled job ends", 120, _logs(slurm, log))
    took = time.monotonic() - cancelled
    text = log.read_text()
    assert took < KILL_WAIT_S - 5, (took, text[-3000:])  # not ended by Slurm's SIGKILL
    # The driver says it stopped, unless Ray's core worker ended it first on losing its node's
    # raylet (exit status 1); the script's line says it always. The trials' records are on
    # disk for --resume.
    assert re.search(r"sweep.sbatch: stopped by TERM; continue with: sbatch \[the same "
                     r"options\] slurm/sweep.sbatch sweeps/digits_grid.py .* --resume\n", text)
    assert any(out.glob("tune/digits_grid/trials/*/epochs.jsonl"))
    assert "signal wakeup fd" not in text  # the StopWatch reads it to the end
    assert not with_text(f"/tmp/ray_{job}_"), job
    print(f"ended {took:.0f} s after scancel")


FAKE_DRIVER = """\
import json, os, signal, sys, time
progress = os.environ["SWEEP_PROGRESS_FILE"]
if sys.argv[1] == "finished":  # what a driver whose trials all finished reports
    with open(progress, "w") as out:
        json.dump({"trials": 2, "finished": 2, "new_epochs": 8}, out)
signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))
print("fake driver running", flush=True)
time.sleep(600)
"""


def test_a_sweep_that_finished_or_makes_no_progress_is_not_requeued(slurm, tmp_path):
    """The walltime's signal (sent by hand, with a lead that covers the whole walltime) to a
    driver that reports every trial finished, and twice to one that reports nothing."""
    driver = tmp_path / "fake_driver.py"
    driver.write_text(FAKE_DRIVER)
    logs = {kind: tmp_path / f"{kind}.log" for kind in ("finished", "stuck")}
    jobs = {kind: slurm.sbatch(log, "--time=10", str(SCRIPT), str(driver), kind, nodes=1,
                               env={"SWEEP_SIGNAL_LEAD": "600"})
            for kind, log in logs.items()}
    every = _logs(slurm, *logs.values())

    def signal_run(kind: str, run: int) -> None:
        _until(lambda: logs[kind].exists() and logs[kind].read_text().count(
            "fake driver running") > run, f"{kind}'s run {run}", 120, every)
        slurm.run("scancel", "--batch", "--signal=USR1", jobs[kind])

    signal_run("finished", 0)
    signal_run("stuck", 0)
    _until(lambda: slurm.job(jobs["stuck"])["Restarts"] == "1", "stuck requeued once", 120,
           every)
    signal_run("stuck", 1)  # a second run without a new epoch
    _until(lambda: _ended(slurm, *jobs.values()), "both jobs end", 120, every)
    finished, stuck = slurm.job(jobs["finished"]), slurm.job(jobs["stuck"])
    assert finished["Restarts"] == "0" and finished["ExitCode"] == "143:0", finished
    assert "every trial had finished: not requeued" in logs["finished"].read_text()
    assert stuck["Restarts"] == "1" and stuck["ExitCode"] == "143:0", stuck
    text = logs["stuck"].read_text()
    assert "requeued; the next run continues with --resume" in text
    assert ("2 runs in a row without a new epoch (SWEEP_MAX_IDLE_REQUEUES=2): not requeued"
            in text), text[-3000:]


def test_a_node_whose_ray_cannot_start_stops_the_job_naming_it(slurm, tmp_path):
    # n2's `ray start` fails (a stand-in for a node that cannot start Ray or reach the head):
    # the job must not run on n1 alone without a word.
    python = tmp_path / "node_python.sh"
    python.write_text(f"""#!/bin/bash
if [[ $SLURMD_NODENAME == n2 && $1 == slurm/ray_node.py && $2 == worker ]]; then
  echo "ray_node: n2: Ray cannot start here (test)" >&2
  exit 1
fi
exec {sys.executable} "$@"
""")
    python.chmod(0o755)
    log = tmp_path / "unjoined.log"
    started = time.monotonic()
    job = slurm.sbatch(log, "--time=10", str(SCRIPT), *SWEEP, "--epochs", "1",
                       "--out", str(tmp_path / "out"),
                       env={"SWEEP_PYTHON": str(python), "SWEEP_NODES_WAIT_S": "10"})
    _until(lambda: _ended(slurm, job), "the job with a missing node ends", 150,
           _logs(slurm, log))
    took = time.monotonic() - started
    error, text = _refused_once(slurm, job, log), log.read_text()
    assert re.match(r"error: 1 of the job's 2 nodes joined the Ray at (\S+) within 10 s "
                    r"\(SWEEP_NODES_WAIT_S waits longer\): n2 did not\. Their `ray start` was "
                    r"given \1", error), error
    assert "Traceback" not in text and "epoch 1/" not in text
    assert took < 120, took  # the wait, with the job's start and Ray's


def _can_run(user: str, python: Path, script: Path) -> bool:
    """Whether `user` can run `python` and read `script` (a private checkout: no)."""
    if shutil.which("setpriv") is None:
        return False
    # Through a shell, as a job runs it (setpriv's own exec of the path can still reach
    # through a directory the user cannot: a venv over an interpreter under /root).
    return subprocess.run(["setpriv", f"--reuid={user}", f"--regid={OTHER_GID}",
                           "--clear-groups", "sh", "-c", '"$0" -c "open($1).close()"',
                           str(python), repr(str(script))],
                          capture_output=True, timeout=60).returncode == 0


OTHER_USER, OTHER_GID = "nobody", "65534"  # Debian's nobody / nogroup


def _python_for_everyone(folder: Path) -> Path | None:
    """A venv in `folder` over the system's interpreter of this Python's version, reading this
    environment's packages: what another user can run where this venv's interpreter lies in a
    private home (pyenv under /root). None where the system has no such interpreter."""
    system = Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")
    if not system.exists():
        return None
    venv = folder / "venv"
    subprocess.run([str(system), "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    python = venv / "bin" / "python"
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    ours, theirs = (subprocess.run([str(py), "-c", purelib], capture_output=True, text=True,
                                   check=True, timeout=60).stdout.strip()
                    for py in (sys.executable, python))
    (Path(theirs) / "borrowed.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
    ray = Path(sys.executable).with_name("ray").read_text().splitlines()
    (venv / "bin" / "ray").write_text("\n".join([f"#!{python}", *ray[1:]]) + "\n")
    (venv / "bin" / "ray").chmod(0o755)
    return python


def test_another_users_job_after_a_root_job_on_the_node_both_finish(slurm, tmp_path):
    # Labs share nodes: a root job's port claims once made every later job of another user
    # on that node crash (PermissionError on /tmp/ray_port_blocks/<port>).
    shared = Path(tempfile.mkdtemp(prefix="users", dir="/tmp"))
    shared.chmod(0o1777)
    python = Path(sys.executable)
    if not _can_run(OTHER_USER, python, SCRIPT):
        python = _python_for_everyone(shared)
    if python is None or not _can_run(OTHER_USER, python, SCRIPT):
        shutil.rmtree(shared, ignore_errors=True)
        pytest.skip(f"user {OTHER_USER} cannot run this checkout's Python (a private "
                    f"checkout, or a venv over an interpreter in a private home)")
    # A /tmp of the test's own (sticky, world-writable: /tmp's mode), so the jobs meet the
    # port claims as a node's first jobs do, not as earlier runs on this host left them.
    (shared / "tmp").mkdir(mode=0o1777)
    (shared / "tmp").chmod(0o1777)
    env = {"SWEEP_PYTHON": str(python), "SWEEP_RAY_TMP": str(shared / "tmp")}
    try:
        logs = [shared / "root.log", shared / "other.log"]
        root_job = slurm.sbatch(logs[0], "-w", "n2", "--mem=500", "--time=5", str(SCRIPT),
                                "sweeps/digits_grid.py", "--dry-run", nodes=1, env=env)
        _until(lambda: _ended(slurm, root_job), "the root job ends", 120, _logs(slurm, *logs))
        other_job = slurm.sbatch(logs[1], f"--uid={OTHER_USER}", f"--gid={OTHER_GID}",
                                 "-w", "n2", "--mem=500", "--time=5", str(SCRIPT),
                                 "sweeps/digits_grid.py", "--dry-run", nodes=1, env=env)
        _until(lambda: _ended(slurm, other_job), "the other user's job ends", 120,
               _logs(slurm, *logs))
        for job, log in ((root_job, logs[0]), (other_job, logs[1])):
            text = log.read_text()
            assert slurm.job(job)["ExitCode"] == "0:0", text[-3000:]
            assert "ray_node: head on n2, ports" in text and "Traceback" not in text, \
                text[-3000:]
        assert slurm.job(other_job)["UserId"].startswith(OTHER_USER)
    finally:
        shutil.rmtree(shared, ignore_errors=True)


# Compared between the Slurm run and the local one: what the trial computed (not where or
# how fast, nor Tune's ids).
METRICS = ("train_acc", "test_acc", "loss_task", "mi", "penalty", "mi_eval", "mi_eval_cond")


def _new_epochs(job: str, run: int) -> int:
    """The epochs run `run` of `job` trained so far, from the progress its driver writes."""
    try:
        return json.loads(Path(f"/tmp/ray_{job}_{run}.progress").read_text())["new_epochs"]
    except (OSError, ValueError, KeyError):
        return 0


def test_a_sweep_over_four_walltimes_finishes_with_a_local_runs_rows(slurm, tmp_path):
    """The walltime's signal (by hand, with a lead over the whole walltime) in each of three
    runs once it trained an epoch: each run requeues and the next resumes, and the fourth
    finishes the sweep with every epoch once and the numbers of a run never stopped."""
    epochs = 8  # three runs stop after an epoch or two each: the fourth has some left
    sweep = ["sweeps/digits_grid.py", "--sigma", "0.03", "--lam", "1", "--seeds", "0", "--K", "2",
             "--batch-size", "256", "--mi-eval-steps", "20", "--device", "cpu",
             "--cpus-per-trial", "1", "--epochs", str(epochs), *SMALL_NET]
    out, log = tmp_path / "slurm", tmp_path / "walltimes.log"
    job = slurm.sbatch(log, "--time=10", str(SCRIPT), *sweep, "--out", str(out), nodes=1,
                       env={"SWEEP_SIGNAL_LEAD": "600"})
    # The run never stopped, beside the job: the job's time is mostly Ray's starts and requeues.
    local = subprocess.Popen([sys.executable, *sweep, "--out", str(tmp_path / "local")], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)
    try:
        every = _logs(slurm, log)
        for run in range(3):
            _until(lambda run=run: _new_epochs(job, run) >= 1, f"run {run} trains an epoch",
                   180, every)
            slurm.run("scancel", "--batch", "--signal=USR1", job)
            _until(lambda run=run: slurm.job(job)["Restarts"] == str(run + 1)
                   or _ended(slurm, job), f"run {run} requeued", 120, every)
        _until(lambda: _ended(slurm, job), "the fourth run ends", 240, every)
        info, text = slurm.job(job), log.read_text()
        assert info["JobState"] == "COMPLETED" and info["Restarts"] == "3", (info, text[-3000:])
        assert text.count("requeued; the next run continues with --resume") == 3, text[-3000:]
        assert "Traceback" not in text, text[-3000:]
        output = local.communicate(timeout=300)[0]
    finally:
        if local.poll() is None:
            stop_group(local)
    assert local.returncode == 0, output[-3000:]
    keys = ["lam", "seed", "epoch"]
    slurm_rows, local_rows = (pd.read_parquet(o / "results.parquet").sort_values(keys)
                              .reset_index(drop=True) for o in (out, tmp_path / "local"))
    assert list(slurm_rows["epoch"]) == list(range(1, epochs + 1)), slurm_rows
    assert slurm_rows["start_epoch"].nunique() == 4, slurm_rows[["epoch", "start_epoch"]]
    metrics = [m for m in METRICS if m in local_rows.columns]
    pd.testing.assert_frame_equal(slurm_rows[keys + metrics], local_rows[keys + metrics])
