"""A real two-node Ray cluster on this machine: `ray start --head` plus `ray start --address`,
then the digits driver joins it with `--address`: its two trials run one on each node, and
when the worker node is lost, its trial goes on on the head from its last checkpoint.

Isolation from the other Ray instances on this machine (the session's `ray_local`, other test
runs): each node gets its own `--temp-dir` (so `ray_current_cluster` is written there, not in
/tmp/ray, and a plain `ray.init()` elsewhere never finds this cluster), its own free ports,
and is stopped by signalling the process group of its `ray start --block`, never by
`ray stop` (which kills every Ray on the machine). This process never calls ray.init.
"""

from __future__ import annotations

import json
import os
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
from tests.processes import descendants

# `ray start` nodes with a --temp-dir of their own (conftest's RAY_TMPDIR check cannot see them)
pytestmark = [pytest.mark.ray, pytest.mark.system]

ROOT = Path(__file__).resolve().parents[1]
RAY = str(Path(sys.executable).with_name("ray"))
STARTED = "Ray runtime started."


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


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
    head: subprocess.Popen  # `ray start --head --block`
    worker: subprocess.Popen  # `ray start --address --block`


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[Cluster]:
    """Head (1 CPU, resource node_a) and worker (1 CPU, resource node_b): a start and stop
    is ~25 s. The test kills the worker node."""
    # Short path: Ray's unix sockets live under it and must stay under 108 characters.
    temp = tempfile.mkdtemp(prefix="rmn", dir="/tmp")
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    common = ["--num-cpus", "1", "--num-gpus", "0", "--object-store-memory", "200000000",
              "--temp-dir", temp, "--disable-usage-stats", "--block"]
    nodes = [
        ("head", ["--head", "--port", str(port), "--include-dashboard", "false",
                  "--resources", json.dumps({"node_a": 1})]),
        ("worker", ["--address", f"127.0.0.1:{port}", "--resources", json.dumps({"node_b": 1})]),
    ]
    procs: list[subprocess.Popen] = []
    try:
        for name, args in nodes:
            log = Path(temp) / f"{name}.log"
            with open(log, "w") as out:
                procs.append(subprocess.Popen(
                    [RAY, "start", *args, "--dashboard-agent-listen-port", str(_free_port()),
                     *common], env=env, stdout=out, stderr=subprocess.STDOUT,
                    start_new_session=True))
            _wait_for(lambda log=log: STARTED in log.read_text(), f"{name} node", 120, procs)
        assert _listening(port)
        yield Cluster(f"127.0.0.1:{port}", procs[0], procs[1])
    finally:
        _stop(list(reversed(procs)))
        shutil.rmtree(temp, ignore_errors=True)


def _reported_epochs(experiment: Path) -> list[int]:
    """Epochs each trial has reported so far (from Tune's result.json in the storage)."""
    counts = []
    for path in experiment.glob("*/result.json"):
        counts.append(sum(1 for line in path.read_text().splitlines() if line.strip()))
    return counts


def test_a_lost_worker_node_costs_only_the_epochs_since_the_last_checkpoint(two_nodes,
                                                                            tmp_path):
    """Two 1-CPU trials on two 1-CPU nodes run side by side, one on each, their state and
    checkpoints on the storage both nodes see. Then a spot reclaim: the worker node and
    everything it runs are SIGKILLed mid-trial. Tune restarts that trial from its last
    checkpoint on the head; every epoch is recorded once."""
    storage = tmp_path / "shared"
    out = tmp_path / "out"
    # The small net's epochs are short (~2 s idle): 8 of them leave the faster trial 7 epochs
    # of slack to still be running when the slower one has reported its first.
    epochs = 8
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(RAY_USAGE_STATS_ENABLED="0", PYTHONUNBUFFERED="1")
    driver = subprocess.Popen(
        [sys.executable, str(ROOT / "sweeps" / "digits_grid.py"), "--address",
         two_nodes.address, "--sigma", "0.03", "--lam", "0,1", "--seeds", "0", "--epochs",
         str(epochs), "--K", "2", "--batch-size", "256", "--mi-eval-steps", "30", "--device",
         "cpu", "--cpus-per-trial", "1", *SMALL_NET, "--storage-path", str(storage),
         "--shared-storage", "--out",
         str(out)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)
    experiment = storage / out.name / "digits_grid"
    try:
        # Two 1-CPU trials on two 1-CPU nodes: one runs on each. Once both have reported
        # their first epoch (with its checkpoint), the worker node vanishes.
        deadline = time.monotonic() + 300
        while len(_reported_epochs(experiment)) < 2 or min(_reported_epochs(experiment)) < 1:
            assert driver.poll() is None, driver.stdout.read()[-3000:]
            assert time.monotonic() < deadline, "the trials did not report in time"
            time.sleep(0.2)
        lost_at = max(_reported_epochs(experiment))
        assert lost_at < epochs, "a trial finished before the node was lost"
        victims = [two_nodes.worker.pid, *descendants(two_nodes.worker.pid)]
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        text, _ = driver.communicate(timeout=600)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait(10)
    assert driver.returncode == 0, text[-3000:]
    df = pd.read_parquet(out / "results.parquet")
    assert (df["status"] == "ok").all() and df["node_id"].notna().all()
    # before the loss, one trial on each node
    assert df.loc[df["epoch"] == 1, "node_id"].nunique() == 2, df[["trial_id", "node_id"]]
    # Tune's trial state went to the storage path (STORAGE/<name of OUT>/<experiment>), with
    # each trial's checkpoint, not to OUT/tune.
    assert (experiment / "tuner.pkl").exists()
    checkpoints = list(experiment.glob("*/checkpoint_*"))
    assert len(checkpoints) == 2, sorted(p.name for p in experiment.iterdir())
    assert not (out / "tune").exists()
    # every epoch of every trial exactly once
    per_trial = df.groupby("trial_id")["epoch"].apply(lambda e: sorted(e))
    assert all(list(e) == list(range(1, epochs + 1)) for e in per_trial), per_trial
    # the trial on the lost node resumed after its last checkpoint, on the other node
    restarted = df[df["start_epoch"] > 1]
    assert restarted["trial_id"].nunique() == 1, df[["trial_id", "epoch", "start_epoch"]]
    trial = df[df["trial_id"] == restarted["trial_id"].iloc[0]].sort_values("epoch")
    resumed_at = int(restarted["start_epoch"].min())
    assert 2 <= resumed_at <= lost_at + 1
    before = trial[trial["epoch"] < resumed_at]
    after = trial[trial["epoch"] >= resumed_at]
    assert (after["start_epoch"] == resumed_at).all()
    assert set(before["node_id"]).isdisjoint(set(after["node_id"]))  # it moved off the node
    print(f"node lost after {lost_at} reported epoch(s); restarted trial:\n"
          + trial[["trial_id", "lam", "epoch", "start_epoch", "node_id"]].to_string())
