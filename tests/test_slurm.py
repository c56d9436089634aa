"""A sweep as Slurm jobs, on a real Slurm started here: munged, slurmctld and two slurmd (`-N
n1`, `-N n2`) on this host, each on ports of its own, with their config, state, spool,
logs and munge socket in the test's directory, stopped by pid; never a daemon the packages
may have started. Where Slurm cannot be started, the test fails saying why.

One scenario, two jobs side by side on the same two nodes (each 1 CPU of a node's 2),
`sbatch slurm/sweep.sbatch sweeps/digits_grid.py ...`:
- A meets its walltime: Slurm's early signal reaches the batch script, the driver saves, Ray
  stops, the job requeues itself, and its second run, on a new Ray, resumes: every epoch once.
- B is stopped by hand with the same signal (`scancel --batch --signal=USR1`): it ends with
  the driver's 143, not requeued, and `sbatch ... --resume` finishes it.
Each job's Ray has ports and directories of its own; neither disturbs the other; each
trial's rows name the Slurm node it ran on, and both nodes ran trials.

The walltime is brought forward once A has a checkpoint (`scontrol update TimeLimit`), and
set back while the requeued job waits: Slurm checks time limits every 30 s and --time has a
1-minute floor, so a sweep sized to meet a fixed walltime mid-run would take minutes more, or
race it. The signal, the stop, the requeue and the resume are Slurm's and the script's.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import SMALL_NET
from tests.processes import free_port, with_text

# Daemons, signals, Ray clusters the jobs start (conftest's RAY_TMPDIR check cannot see them)
pytestmark = [pytest.mark.ray, pytest.mark.system, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "slurm" / "sweep.sbatch"
PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "squeue", "scancel")
INSTALL = "apt-get install -y slurm-wlm munge (make test installs them where it can)"
NODES = ("n1", "n2")
# Two trials, one on each node (a job gets 1 CPU on each). A's run long enough that the
# walltime, brought forward after its first checkpoint, falls mid-sweep (Slurm signals at its
# next 30-s check).
SWEEP = ["sweeps/digits_grid.py", "--sigma", "0.03", "--lam", "0,1", "--seeds", "0", "--K", "2",
         "--batch-size", "256", "--mi-eval-steps", "20", "--device", "cpu",
         "--cpus-per-trial", "1", *SMALL_NET]
LEAD_S = 180  # A's early signal: `--signal=B:USR1@180`, and SWEEP_SIGNAL_LEAD for the script


@dataclass
class Slurm:
    env: dict[str, str]  # SLURM_CONF for the commands
    home: Path

    def run(self, *cmd: str) -> str:
        done = subprocess.run(list(cmd), env=self.env, capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, f"{cmd}: {done.stderr}"
        return done.stdout

    def job(self, job_id: str) -> dict[str, str]:
        text = self.run("scontrol", "show", "job", "-o", job_id)
        return dict(re.findall(r"(\w+)=(\S*)", text))

    def sbatch(self, log: Path, *args: str, env: dict[str, str] | None = None) -> str:
        done = subprocess.run(["sbatch", "--parsable", "--nodes=2", "--mem=1000",
                               f"--output={log}", *args], cwd=ROOT, capture_output=True,
                              text=True, env={**self.env, **(env or {})}, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip().split(";")[0]


def _stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


@pytest.fixture(scope="module")
def slurm() -> Iterator[Slurm]:
    missing = [p for p in PROGRAMS if not (shutil.which(p) or Path("/usr/sbin", p).exists())]
    if missing:
        pytest.fail(f"Slurm cannot be started here: no {', '.join(missing)} ({INSTALL})",
                    pytrace=False)
    if os.geteuid() != 0:
        pytest.fail("Slurm cannot be started here: slurmd runs jobs as their user and must "
                    "run as root", pytrace=False)
    home = Path(tempfile.mkdtemp(prefix="slm", dir="/tmp"))  # the munge socket: short path
    munge = home / "munge"
    munge.mkdir(mode=0o700)
    (munge / "key").write_bytes(os.urandom(1024))
    (munge / "key").chmod(0o400)
    for name in ("state", "log", *(f"spool/{n}" for n in NODES)):
        (home / name).mkdir(parents=True)
    host = socket.gethostname()
    ports = {name: free_port() for name in ("ctld", *NODES)}
    # cred_expire: how long a requeued job waits before it may start again (120 s by
    # default); sched_interval: how often pending jobs are looked at (60 s).
    (home / "slurm.conf").write_text("\n".join([
        "ClusterName=test", f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={ports['ctld']}", "SlurmUser=root", "SlurmdUser=root",
        "AuthType=auth/munge", "CredType=cred/munge",
        f"AuthInfo=socket={munge}/socket,cred_expire=5",
        f"StateSaveLocation={home}/state", f"SlurmdSpoolDir={home}/spool/%n",
        f"SlurmctldPidFile={home}/slurmctld.pid", f"SlurmdPidFile={home}/slurmd.%n.pid",
        f"SlurmctldLogFile={home}/log/slurmctld.log", f"SlurmdLogFile={home}/log/%n.log",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU_Memory",
        "SchedulerType=sched/builtin", "SchedulerParameters=sched_interval=2",
        "MpiDefault=none", "ReturnToService=2", "JobCompType=jobcomp/none",
        "AccountingStorageType=accounting_storage/none", "JobAcctGatherType=jobacct_gather/none",
        *(f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={ports[n]} CPUs=2 "
          f"RealMemory=3000 State=UNKNOWN" for n in NODES),
        f"PartitionName=test Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE State=UP",
        ""]))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "RAY_ADDRESS"))}
    env.update(SLURM_CONF=str(home / "slurm.conf"), RAY_USAGE_STATS_ENABLED="0",
               PYTHONUNBUFFERED="1", PATH=f"{env.get('PATH', '')}:/usr/sbin")
    daemons = [
        ["munged", "-F", "-f", f"--socket={munge}/socket", f"--key-file={munge}/key",
         f"--pid-file={munge}/pid", f"--log-file={munge}/log", f"--seed-file={munge}/seed"],
        ["slurmctld", "-D", "-i"],
        *(["slurmd", "-D", "-N", n] for n in NODES),
    ]
    procs: list[subprocess.Popen] = []
    cluster = Slurm(env, home)
    try:
        for cmd in daemons:
            with open(home / "log" / f"{cmd[0]}{cmd[-1] if cmd[0] == 'slurmd' else ''}.out",
                      "w") as out:
                procs.append(subprocess.Popen(cmd, env=env, stdout=out,
                                              stderr=subprocess.STDOUT,
                                              start_new_session=True))
            if cmd[0] == "munged":
                _wait(lambda: (munge / "socket").exists(), "munged", 20, procs, home)
        _wait(lambda: _idle(env), "two idle slurmd nodes", 60, procs, home)
        yield cluster
    finally:
        subprocess.run(["scancel", "--full", "--partition=test"], env=env, timeout=60,
                       capture_output=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and subprocess.run(
                ["squeue", "-h"], env=env, capture_output=True, text=True).stdout.strip():
            time.sleep(1)
        _stop(list(reversed(procs)))
        shutil.rmtree(home, ignore_errors=True)


def _idle(env: dict[str, str]) -> bool:
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], env=env, capture_output=True,
                         text=True, timeout=30).stdout
    return sorted(out.split()) == sorted([*NODES, "idle", "idle"])


def _wait(check, what: str, timeout_s: float, procs: list[subprocess.Popen],
          home: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        dead = [p.args[0] for p in procs if p.poll() is not None]
        if dead:
            break
        time.sleep(0.5)
    logs = "".join(f"\n--- {p.name}\n{p.read_text(errors='replace')[-1500:]}"
                   for p in sorted((home / "log").iterdir()))
    pytest.fail(f"Slurm cannot be started here: {what} not ready after {timeout_s:.0f} s"
                f"{f' ({dead[0]} exited)' if dead else ''}{logs}", pytrace=False)


def _until(check, what: str, timeout_s: float, logs: list[Path]) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            tails = "".join(f"\n--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                            for p in logs if p.exists())
            raise AssertionError(f"{what}: not after {timeout_s:.0f} s{tails}")
        time.sleep(0.2)


def _checkpointed(out: Path) -> bool:
    return any(out.glob("tune/digits_grid/*/checkpoint_*"))


def _addresses(log: Path) -> list[str]:
    return re.findall(r"ray_node: head on \S+, ports \S+, address (\S+)", log.read_text())


def _check_results(out: Path, epochs: int) -> pd.DataFrame:
    assert (out / "table.md").is_file()
    df = pd.read_parquet(out / "results.parquet")
    assert (df["status"] == "ok").all(), df
    per_trial = df.groupby("trial_id")["epoch"].apply(sorted)
    assert len(per_trial) == 2 and all(list(e) == list(range(1, epochs + 1))
                                       for e in per_trial), per_trial
    # Each row names the Slurm node its trial ran on (the host is the same), and both nodes
    # ran trials (a trial restarted by a resume may go on, or start again, on either).
    assert set(df["node"]) == set(NODES), df[["trial_id", "epoch", "node"]]
    return df


def test_two_sweeps_share_the_nodes_one_survives_its_walltime_the_other_a_stop(slurm,
                                                                               tmp_path):
    out_a, out_b = tmp_path / "a", tmp_path / "b"
    log_a, log_b, log_b2 = (tmp_path / f"{n}.log" for n in ("a", "b", "b2"))
    epochs_a, epochs_b = 80, 4
    started = time.monotonic()
    job_a = slurm.sbatch(log_a, "--time=10", f"--signal=B:USR1@{LEAD_S}", str(SCRIPT), *SWEEP,
                         "--epochs", str(epochs_a), "--out", str(out_a),
                         env={"SWEEP_SIGNAL_LEAD": str(LEAD_S)})
    job_b = slurm.sbatch(log_b, "--time=10", str(SCRIPT), *SWEEP, "--epochs", str(epochs_b),
                         "--out", str(out_b))
    logs = [log_a, log_b, log_b2, slurm.home / "log" / "slurmctld.log"]
    _until(lambda: _checkpointed(out_a) and _checkpointed(out_b),
           "both sweeps have a checkpoint", 240, logs)
    # Both jobs run at once on both nodes, each with a Ray of its own (its own GCS port).
    for job in (job_a, job_b):
        info = slurm.job(job)
        assert info["JobState"] == "RUNNING" and info["NodeList"] == "n[1-2]", info
    (address_a,), (address_b,) = _addresses(log_a), _addresses(log_b)
    assert address_a != address_b

    # B: stopped by hand with the walltime's signal, 9 minutes before its walltime. A's
    # walltime is brought forward only once B has ended, so that A is sure to be running when
    # B's end is checked for leaving it alone (A's early signal could otherwise come first).
    slurm.run("scancel", "--batch", "--signal=USR1", job_b)
    _until(lambda: slurm.job(job_b)["JobState"] not in ("RUNNING", "COMPLETING"),
           "B ends after its signal", 120, logs)
    info = slurm.job(job_b)
    assert info["JobState"] == "FAILED" and info["ExitCode"] == "143:0", info  # the driver's
    assert info["Restarts"] == "0"
    assert "stopped by USR1; continue with" in log_b.read_text()
    info = slurm.job(job_a)
    assert info["JobState"] == "RUNNING" and info["Restarts"] == "0", info  # A's Ray untouched
    # A: its walltime brought forward to between 100 and 160 s from now, inside the 180-s
    # lead: the early signal is due already and comes at Slurm's next check (within 30 s),
    # which leaves A over a minute to stop and requeue. A's 80 epochs outlast that on a fast
    # machine: its first run stopped at epoch 31 here alone, 9 beside the unit tests.
    elapsed = time.monotonic() - started
    slurm.run("scontrol", "update", f"JobId={job_a}",
              f"TimeLimit={math.ceil((elapsed + 100) / 60)}")
    job_b2 = slurm.sbatch(log_b2, "--time=10", str(SCRIPT), *SWEEP, "--epochs",
                          str(epochs_b), "--out", str(out_b), "--resume")

    # A is requeued; while it waits, its walltime is set back, for one more run, not several.
    _until(lambda: slurm.job(job_a)["Restarts"] == "1", "A requeued at its walltime", 150,
           logs)
    slurm.run("scontrol", "update", f"JobId={job_a}", "TimeLimit=10")
    for job, what in ((job_a, "A's second run"), (job_b2, "B's --resume")):
        _until(lambda job=job: slurm.job(job)["JobState"] not in
               ("PENDING", "RUNNING", "COMPLETING", "REQUEUED"), what, 240, logs)
        info = slurm.job(job)
        assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", \
            (info, log_a.read_text()[-3000:], log_b2.read_text()[-3000:])
    took = time.monotonic() - started

    text_a = log_a.read_text()
    assert "the walltime is" in text_a and "requeued" in text_a, text_a[-3000:]
    first, second = _addresses(log_a)
    assert first != second  # the requeued run joined a Ray of its own, not the old address
    assert "resuming" in text_a
    df_a = _check_results(out_a, epochs_a)
    assert (df_a["start_epoch"] > 1).any(), df_a[["trial_id", "epoch", "start_epoch"]]
    assert "resuming" in log_b2.read_text()
    df_b = _check_results(out_b, epochs_b)
    assert (df_b["start_epoch"] > 1).any(), df_b[["trial_id", "epoch", "start_epoch"]]
    # Each node's Ray stopped by pid and its directory removed; no process of any left.
    for job in (job_a, job_b, job_b2):
        assert not list(Path("/tmp").glob(f"ray_{job}_*")), job
        assert not with_text(f"/tmp/ray_{job}_"), job
    print(f"A, B and B's resume: {took:.0f} s")
