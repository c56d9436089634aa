"""A real two-node Ray cluster on this machine: `ray start --head` plus `ray start --address`,
then the digits driver joins it with `--address`: its two trials run one on each node, and
when the worker node is lost, its trial goes on on the head from its last checkpoint. A sweep
submitted to the head with `ray job submit` runs on the same cluster.

Isolation from the other Ray instances on this machine (the session's `ray_local`, other test
runs): each node gets its own `--temp-dir` (so `ray_current_cluster` is written there, not in
/tmp/ray, and a plain `ray.init()` elsewhere never finds this cluster), its own free ports,
and is stopped by signalling the process group of its `ray start --block`, never by
`ray stop` (which kills every Ray on the machine). This process never calls ray.init.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import SMALL_NET
from tests.processes import descendants, free_port
from tests.s3 import BUCKET, S3, s3_server

# `ray start` nodes with a --temp-dir of their own (conftest's RAY_TMPDIR check cannot see them)
pytestmark = [pytest.mark.ray, pytest.mark.system]

ROOT = Path(__file__).resolve().parents[1]
RAY = str(Path(sys.executable).with_name("ray"))
STARTED = "Ray runtime started."
# What `ray[default]` adds (its job server), installed beside the environment by the Makefile
# (tools/ray_default_extras.py) and put on the head's PYTHONPATH only.
RAY_DEFAULT = Path(sys.prefix) / "ray-default"
# Under a node's --temp-dir, the working directory Tune stages for each trial run there (named
# as the trial's directory in the storage).


def _wait_for(check, what: str, timeout_s: float, procs: list[subprocess.Popen]) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        dead = [p for p in procs if p.poll() is not None]
        if dead:
            raise RuntimeError(f"{what}: `ray start` exited with {dead[0].returncode}")
        time.sleep(0.5)
    raise TimeoutError(f"{what}: not ready after {timeout_s:.0f} s")


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def _stop(procs: list[subprocess.Popen], grace_s: float = 10.0) -> None:
    """SIGTERM each `ray start --block` (it stops its node's processes), then SIGKILL whatever
    is left in their process groups (workers the raylets spawned) after `grace_s`."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + grace_s
    for proc in procs:
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(10)


@dataclass
class Cluster:
    address: str
    dashboard: str  # the head's dashboard, where `ray job submit` goes
    head_temp: Path  # the head's --temp-dir
    head: subprocess.Popen  # `ray start --head --block`
    worker: subprocess.Popen  # `ray start --address --block`
    worker_temp: Path  # the worker node's --temp-dir: its sessions, logs, trial directories
    s3: S3  # the bucket every node reaches (tests/s3.py)


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[Cluster]:
    """Head (1 CPU, resource node_a) and worker (1 CPU, resource node_b), each with a
    temporary directory of its own, as on two machines, and both started with a local S3
    API's settings (Tune's state goes to its bucket): a start and stop is ~25 s. The head runs
    the dashboard's job server, with `ray[default]` on its PYTHONPATH and this environment's
    `python` first on its PATH (a cluster's image has both). The last test kills the worker
    node."""
    if not (RAY_DEFAULT / "aiohttp_cors").is_dir():
        pytest.fail(f"ray[default]'s packages are not in {RAY_DEFAULT}: the head's job server "
                    f"needs them (make test installs them: python tools/ray_default_extras.py "
                    f"{RAY_DEFAULT})")
    # Short paths: Ray's unix sockets live under them and must stay under 108 characters.
    temps = {name: tempfile.mkdtemp(prefix=f"rmn{name[0]}", dir="/tmp")
             for name in ("head", "worker")}
    port, dashboard_port = free_port(), free_port()
    procs: list[subprocess.Popen] = []
    with s3_server(Path(temps["head"])) as s3:
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        env.update(s3.env, RAY_USAGE_STATS_ENABLED="0")
        common = ["--num-cpus", "1", "--num-gpus", "0", "--object-store-memory", "200000000",
                  "--disable-usage-stats", "--block"]
        nodes = [
            ("head", ["--head", "--port", str(port), "--include-dashboard", "true",
                      "--dashboard-port", str(dashboard_port),
                      "--resources", json.dumps({"node_a": 1})]),
            ("worker", ["--address", f"127.0.0.1:{port}",
                        "--resources", json.dumps({"node_b": 1})]),
        ]
        try:
            for name, args in nodes:
                log = Path(temps["head"]) / f"{name}.log"
                node_env = env if name == "worker" else {
                    **env, "PYTHONPATH": os.pathsep.join(
                        filter(None, [str(RAY_DEFAULT), env.get("PYTHONPATH")])),
                    "PATH": os.pathsep.join([str(Path(sys.executable).parent), env["PATH"]])}
                with open(log, "w") as out:
                    procs.append(subprocess.Popen(
                        [RAY, "start", *args, "--dashboard-agent-listen-port",
                         str(free_port()), "--temp-dir", temps[name], *common], env=node_env,
                        stdout=out, stderr=subprocess.STDOUT, start_new_session=True))
                _wait_for(lambda log=log: STARTED in log.read_text(), f"{name} node", 120,
                          procs)
            assert _listening(port)
            _wait_for(lambda: _listening(dashboard_port), "the head's dashboard", 60, procs)
            yield Cluster(f"127.0.0.1:{port}", f"http://127.0.0.1:{dashboard_port}",
                          Path(temps["head"]), procs[0], procs[1], Path(temps["worker"]), s3)
        finally:
            _stop(list(reversed(procs)))
    for temp in temps.values():
        shutil.rmtree(temp, ignore_errors=True)


def test_a_sweep_submitted_as_a_ray_job_runs_on_the_cluster_from_the_upload(two_nodes,
                                                                            tmp_path):
    """docs/CLUSTER.md's `ray job submit --working-dir . -- python sweeps/digits_grid.py ...`,
    to the head's dashboard from this checkout: Ray uploads what .gitignore leaves (no .venv,
    no .git), the entrypoint joins the head's cluster with no --address, its state goes to the
    bucket (the cluster's storage rule), every epoch is reported once, and the outputs land at
    the absolute --out and in the bucket."""
    s3 = two_nodes.s3
    out = tmp_path / "job"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(RAY_USAGE_STATS_ENABLED="0")
    submitted = subprocess.run(
        [RAY, "job", "submit", "--address", two_nodes.dashboard, "--working-dir", ".", "--",
         "python", "sweeps/digits_grid.py", "--sigma", "0.03", "--lam", "1", "--seeds", "0",
         "--epochs", "2", "--K", "2", "--batch-size", "256", "--mi-eval-steps", "20",
         "--device", "cpu", "--cpus-per-trial", "1", *SMALL_NET,
         "--storage-path", f"s3://{BUCKET}/job", "--out", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    log = submitted.stdout + submitted.stderr
    assert submitted.returncode == 0 and "succeeded" in log, log[-3000:]
    port = two_nodes.address.rsplit(":", 1)[1]
    joined = [line for line in log.splitlines() if "Connected to Ray cluster" in line
              or "Connecting to existing Ray cluster" in line]
    assert joined and any(f":{port}" in line for line in joined), log[-3000:]
    uploads = {path.resolve() for path in two_nodes.head_temp.glob(
        "session_*/runtime_resources/working_dir_files/_ray_pkg_*") if path.is_dir()}
    assert len(uploads) == 1, uploads
    upload = uploads.pop()
    assert (upload / "sweeps" / "digits_grid.py").is_file()
    assert not (upload / ".venv").exists() and not (upload / ".git").exists()
    df = pd.read_parquet(out / "results.parquet")
    assert (df["status"] == "ok").all() and sorted(df["epoch"]) == [1, 2], df
    keys = s3.keys(f"job/{out.name}")
    assert f"job/{out.name}/digits_grid/tuner.pkl" in keys, keys
    assert f"job/{out.name}/outputs/results.parquet" in keys, keys


def test_a_lost_worker_node_costs_only_the_epochs_since_the_last_checkpoint(two_nodes,
                                                                            tmp_path):
    """Two 1-CPU trials on two 1-CPU nodes run side by side, one on each, their state and
    checkpoints in an S3 bucket. Then a spot reclaim: the worker node and everything it runs
    are SIGKILLed mid-trial and its disk is gone. Tune restarts that trial on the head from
    its last checkpoint, read back from the bucket; every epoch is recorded once; the
    outputs land in the bucket."""
    s3 = two_nodes.s3
    out = tmp_path / "out"
    # The small net's epochs take ~2 s idle: the node is lost within a second of its trial's
    # first checkpoint, epochs before that trial's end.
    epochs = 4
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(s3.env, RAY_USAGE_STATS_ENABLED="0", PYTHONUNBUFFERED="1")
    driver = subprocess.Popen(
        [sys.executable, str(ROOT / "sweeps" / "digits_grid.py"), "--address",
         two_nodes.address, "--sigma", "0.03", "--lam", "0,1", "--seeds", "0", "--epochs",
         str(epochs), "--K", "2", "--batch-size", "256", "--mi-eval-steps", "30", "--device",
         "cpu", "--cpus-per-trial", "1", *SMALL_NET, "--storage-path", f"s3://{BUCKET}/lost",
         "--out", str(out)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)
    experiment = f"lost/{out.name}/digits_grid"
    try:
        # Once the worker node's trial has a checkpoint in the bucket (read there, not from
        # the driver's output, which lags), the worker node vanishes. Which trial that is, its
        # record's rows say (each row's node_id), and the node's id its raylet's log. The
        # head's trial may be ahead or behind: under load one started 15 s after the other.
        deadline = time.monotonic() + 300
        worker_id = _node_id(two_nodes.worker_temp)
        while True:
            at_kill = s3.checkpointed_epochs(experiment)  # the trials with a checkpoint
            ours = _trials_on(s3, experiment, worker_id) & set(at_kill)
            if len(ours) == 1:
                lost = ours.pop()
                break
            assert driver.poll() is None, ("the sweep ended before its trial on the worker "
                                           "node was seen checkpointed\n"
                                           + driver.stdout.read()[-3000:])
            assert time.monotonic() < deadline, "the worker node's trial did not checkpoint"
            time.sleep(0.2)
        read_before = len(s3.requests("GET", "/checkpoint/"))
        victims = [two_nodes.worker.pid, *descendants(two_nodes.worker.pid)]
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(two_nodes.worker_temp, ignore_errors=True)  # the node's disk, gone
        # At least the lost trial's last checkpoint (it may have written one more meanwhile)
        lost_at = s3.checkpointed_epochs(experiment)[lost]
        assert lost_at < epochs, "the worker node's trial finished before the node was lost"
        text, _ = driver.communicate(timeout=600)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait(10)
    assert driver.returncode == 0, text[-3000:]
    assert len(s3.requests("GET", "/checkpoint/")) > read_before  # restored from the bucket
    df = pd.read_parquet(out / "results.parquet")
    assert (df["status"] == "ok").all() and df["node_id"].notna().all()
    # before the loss, one trial on each node
    assert df.loc[df["epoch"] == 1, "node_id"].nunique() == 2, df[["trial_id", "node_id"]]
    # Tune's files and each trial's record in the bucket (STORAGE/<name of OUT>/<experiment>),
    # not in OUT/tune; the outputs there too.
    keys = s3.keys(f"lost/{out.name}")
    assert f"{experiment}/tuner.pkl" in keys
    assert len(s3.checkpointed_epochs(experiment)) == 2
    assert f"lost/{out.name}/outputs/results.parquet" in keys, keys
    assert not (out / "tune").exists()
    # every epoch of every trial exactly once
    per_trial = df.groupby("trial_id")["epoch"].apply(lambda e: sorted(e))
    assert all(list(e) == list(range(1, epochs + 1)) for e in per_trial), per_trial
    # the trial on the lost node resumed after its last checkpoint, on the other node
    restarted = df[df["start_epoch"] > 1]
    assert restarted["trial_id"].nunique() == 1, df[["trial_id", "epoch", "start_epoch"]]
    assert restarted["trial_id"].iloc[0] == lost  # its record's key
    trial = df[df["trial_id"] == restarted["trial_id"].iloc[0]].sort_values("epoch")
    resumed_at = int(restarted["start_epoch"].min())
    assert 2 <= resumed_at <= lost_at + 1
    before = trial[trial["epoch"] < resumed_at]
    after = trial[trial["epoch"] >= resumed_at]
    assert (after["start_epoch"] == resumed_at).all()
    assert set(before["node_id"]).isdisjoint(set(after["node_id"]))  # it moved off the node
    print(f"node lost with its trial's checkpoints up to epoch {lost_at} (all: {at_kill}); "
          f"restarted trial:\n"
          + trial[["trial_id", "lam", "epoch", "start_epoch", "node_id"]].to_string())


def _node_id(temp: Path) -> str:
    """The id of the Ray node started with --temp-dir `temp`, as its raylet logs it."""
    for log in temp.glob("session_*/logs/raylet.out"):
        found = re.search(r"node ID node_id=([0-9a-f]+)", log.read_text(errors="replace"))
        if found:
            return found.group(1)
    raise AssertionError(f"no raylet log with the node's id under {temp}")


def _trials_on(s3, experiment: str, node_id: str) -> set[str]:
    """The keys of the trials whose record in BUCKET/experiment has a row run on `node_id`."""
    from tests.s3 import BUCKET
    from trainables.record import RecordStore

    records = RecordStore(s3.filesystem(), f"{BUCKET}/{experiment}/trials")
    return {key for key, record in records.read_all().items()
            if any(row.get("node_id") == node_id for row in record.rows)}
