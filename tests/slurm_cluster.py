"""A real Slurm on this host for the tests: munged, slurmctld and two slurmd (`-N n1`, `-N
n2`), each on ports of its own, with their config, state, spool, logs and munge socket in a
directory of their own, stopped by pid; never a daemon the packages may have started.

Each node has 2 CPUs and 2 GPUs as Slurm GRES (`gres.conf` files /dev/tty10-11: Slurm only
needs device files to hand out; a job given `--gres=gpu:N` gets `CUDA_VISIBLE_DEVICES` set in
each node's steps as on a GPU cluster). By hand, for a look at what a job does:

    .venv/bin/python -m tests.slurm_cluster   # prints SLURM_CONF=...; Ctrl-C stops it
"""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.processes import free_port

ROOT = Path(__file__).resolve().parents[1]
PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "squeue", "scancel")
INSTALL = "apt-get install -y slurm-wlm munge (make test installs them where it can)"
NODES = ("n1", "n2")
CPUS, GPUS = 2, 2  # a node's
# task/affinity binds each step to its CPUs, as most sites do; here both nodes are one host,
# so their 1-CPU jobs share its first core, and the two-sweep walltime scenario no longer fits
# its walltime. SLURM_TEST_TASK_PLUGIN=task/affinity runs the Slurm tests that way.
TASK_PLUGIN = os.environ.get("SLURM_TEST_TASK_PLUGIN", "task/none")
GPU_FILES = "/dev/tty[10-11]"  # character devices every Linux has; Slurm opens none
PORT_ATTEMPTS = 3


class SlurmUnavailable(Exception):
    """Slurm cannot be started on this machine (the message says why)."""


@dataclass
class Slurm:
    env: dict[str, str]  # SLURM_CONF for the commands
    home: Path

    def run(self, *cmd: str, check: bool = True) -> str:
        done = subprocess.run(list(cmd), env=self.env, capture_output=True, text=True,
                              timeout=60)
        if check:
            assert done.returncode == 0, f"{cmd}: {done.stderr}"
        return done.stdout

    def job(self, job_id: str) -> dict[str, str]:
        text = self.run("scontrol", "show", "job", "-o", job_id)
        return dict(re.findall(r"(\w+)=(\S*)", text))

    def sbatch(self, log: Path, *args: str, env: dict[str, str] | None = None,
               nodes: int = 2) -> str:
        done = subprocess.run(["sbatch", "--parsable", f"--nodes={nodes}", "--mem=1000",
                               f"--output={log}", *args], cwd=ROOT, capture_output=True,
                              text=True, env={**self.env, **(env or {})}, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip().split(";")[0]

    def logs(self) -> str:
        return "".join(f"\n--- {p.name}\n{p.read_text(errors='replace')[-1500:]}"
                       for p in sorted((self.home / "log").iterdir()))


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


def _idle(env: dict[str, str]) -> bool:
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], env=env, capture_output=True,
                         text=True, timeout=30).stdout
    return sorted(out.split()) == sorted([*NODES, *["idle"] * len(NODES)])


def _wait(check: Callable[[], bool], what: str, timeout_s: float,
          procs: list[subprocess.Popen], cluster: Slurm) -> None:
    deadline = time.monotonic() + timeout_s
    dead: list[str] = []
    while time.monotonic() < deadline:
        if check():
            return
        dead = [str(p.args[0]) for p in procs if p.poll() is not None]
        if dead:
            break
        time.sleep(0.5)
    raise SlurmUnavailable(f"{what} not ready after {timeout_s:.0f} s"
                           f"{f' ({dead[0]} exited)' if dead else ''}{cluster.logs()}")


def config(home: Path, ports: dict[str, int], munge: Path) -> str:
    host = socket.gethostname()
    # cred_expire: how long a requeued job waits before it may start again (120 s by
    # default); sched_interval: how often pending jobs are looked at (60 s).
    return "\n".join([
        "ClusterName=test", f"SlurmctldHost={host}(127.0.0.1)",
        # Job ids of their own: two test Slurms at once (two test files under xdist) would
        # both number from 1, and a job's Ray directory is named after its id.
        f"FirstJobId={random.randrange(1000, 10**6, 1000)}",
        f"SlurmctldPort={ports['ctld']}", "SlurmUser=root", "SlurmdUser=root",
        "AuthType=auth/munge", "CredType=cred/munge",
        f"AuthInfo=socket={munge}/socket,cred_expire=5",
        f"StateSaveLocation={home}/state", f"SlurmdSpoolDir={home}/spool/%n",
        f"SlurmctldPidFile={home}/slurmctld.pid", f"SlurmdPidFile={home}/slurmd.%n.pid",
        f"SlurmctldLogFile={home}/log/slurmctld.log", f"SlurmdLogFile={home}/log/%n.log",
        "ProctrackType=proctrack/linuxproc", f"TaskPlugin={TASK_PLUGIN}",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU_Memory",
        "SchedulerType=sched/builtin", "SchedulerParameters=sched_interval=2",
        "MpiDefault=none", "ReturnToService=2", "JobCompType=jobcomp/none",
        "AccountingStorageType=accounting_storage/none", "JobAcctGatherType=jobacct_gather/none",
        "GresTypes=gpu",
        *(f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={ports[n]} CPUs={CPUS} "
          f"Gres=gpu:{GPUS} RealMemory=3000 State=UNKNOWN" for n in NODES),
        f"PartitionName=test Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE State=UP",
        ""])


def _start(home: Path, munge: Path, env: dict[str, str], cluster: Slurm,
           ) -> list[subprocess.Popen]:
    """munged, slurmctld and the slurmd on ports chosen now, until both nodes are idle; on
    failure they are stopped and their state cleared."""
    ports = {name: free_port() for name in ("ctld", *NODES)}
    (home / "slurm.conf").write_text(config(home, ports, munge))
    daemons = [
        ["munged", "-F", "-f", f"--socket={munge}/socket", f"--key-file={munge}/key",
         f"--pid-file={munge}/pid", f"--log-file={munge}/log", f"--seed-file={munge}/seed"],
        ["slurmctld", "-D", "-i"],
        *(["slurmd", "-D", "-N", n] for n in NODES),
    ]
    procs: list[subprocess.Popen] = []
    try:
        for cmd in daemons:
            with open(home / "log" / f"{cmd[0]}{cmd[-1] if cmd[0] == 'slurmd' else ''}.out",
                      "w") as out:
                procs.append(subprocess.Popen(cmd, env=env, stdout=out,
                                              stderr=subprocess.STDOUT,
                                              start_new_session=True))
            if cmd[0] == "munged":
                _wait(lambda: (munge / "socket").exists(), "munged", 20, procs, cluster)
        _wait(lambda: _idle(env), "two idle slurmd nodes", 60, procs, cluster)
    except BaseException:
        _stop(list(reversed(procs)))
        (munge / "socket").unlink(missing_ok=True)
        for name in ("state", "log", *(f"spool/{n}" for n in NODES)):
            for entry in (home / name).iterdir():
                shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
        raise
    return procs


@contextmanager
def slurm_cluster() -> Iterator[Slurm]:
    """Start the Slurm; on leaving, cancel its jobs, wait for them to end (60 s at most) and
    stop the daemons."""
    missing = [p for p in PROGRAMS if not (shutil.which(p) or Path("/usr/sbin", p).exists())]
    if missing:
        raise SlurmUnavailable(f"no {', '.join(missing)} ({INSTALL})")
    if os.geteuid() != 0:
        raise SlurmUnavailable("slurmd runs jobs as their user and must run as root")
    home = Path(tempfile.mkdtemp(prefix="slm", dir="/tmp"))  # the munge socket: short path
    munge = home / "munge"
    munge.mkdir(mode=0o755)  # another user's srun reaches the socket; the key stays 0400
    (munge / "key").write_bytes(os.urandom(1024))
    (munge / "key").chmod(0o400)
    for name in ("state", "log", *(f"spool/{n}" for n in NODES)):
        (home / name).mkdir(parents=True)
    # Another user's job runs its script from the node's spool directory (mkdtemp: 0700).
    for path in (home, home / "spool", *(home / "spool" / n for n in NODES)):
        path.chmod(0o755)
    (home / "gres.conf").write_text(f"NodeName=n[1-{len(NODES)}] Name=gpu File={GPU_FILES}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "RAY_ADDRESS"))}
    env.update(SLURM_CONF=str(home / "slurm.conf"), RAY_USAGE_STATS_ENABLED="0",
               PYTHONUNBUFFERED="1", PATH=f"{env.get('PATH', '')}:/usr/sbin")
    procs: list[subprocess.Popen] = []
    cluster = Slurm(env, home)
    try:
        for attempt in range(1, PORT_ATTEMPTS + 1):
            try:
                procs = _start(home, munge, env, cluster)
                break
            except SlurmUnavailable as exc:
                # A port free when chosen can be bound by another process before a daemon
                # binds it: choose again. Anything else is not this host's luck: say it.
                if attempt == PORT_ATTEMPTS or "Address already in use" not in str(exc):
                    raise
                print(f"slurm_cluster: a port was taken before a daemon bound it "
                      f"(try {attempt} of {PORT_ATTEMPTS}); new ports", file=sys.stderr)
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


@pytest.fixture(scope="module", name="slurm")
def slurm_fixture() -> Iterator[Slurm]:
    """The test files' Slurm (one per file); where none can start, the test fails saying why."""
    try:
        with slurm_cluster() as cluster:
            yield cluster
    except SlurmUnavailable as exc:
        pytest.fail(f"Slurm cannot be started here: {exc}", pytrace=False)


if __name__ == "__main__":
    try:
        with slurm_cluster() as cluster:
            print(f"export SLURM_CONF={cluster.env['SLURM_CONF']}", flush=True)
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
            signal.sigwait({signal.SIGINT, signal.SIGTERM})
    except SlurmUnavailable as exc:
        print(f"error: Slurm cannot be started here: {exc}", file=sys.stderr)
        sys.exit(2)
