"""A driver ends within seconds of its last line, after a finish or a stop (sweeps/ending.py),
and refuses a sweep no node can place (sweeps/ray_init.check_resources)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from sweeps.common import SweepError
from sweeps.ending import reachable, write_progress
from sweeps.ray_init import (
    NodeShape,
    autoscaler_node_types,
    check_all_joined,
    check_resources,
    expected_nodes,
)
from tests.processes import free_port

ROOT = Path(__file__).resolve().parents[1]


def _run(code: str, timeout_s: float = 60) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout_s)
    return done, time.monotonic() - started


@pytest.mark.ray
def test_a_driver_that_joined_ray_ends_with_its_status_whatever_thread_is_left(tmp_path):
    """A thread left running (a library's writer) would hold the interpreter's own end for
    a minute; end_driver leaves Ray and ends the process with main's status."""
    done, took = _run(
        "import threading, time\n"
        "import ray\n"
        "from sweeps.ending import end_driver\n"
        "from sweeps.ray_init import init_local_ray\n"
        "def main():\n"
        "    init_local_ray()\n"
        f"    open({str(tmp_path / 'session')!r}, 'w').write(\n"
        "        ray.get_runtime_context().gcs_address)\n"
        "    threading.Thread(target=time.sleep, args=(60,), name='stuck-writer').start()\n"
        "    print('last line', flush=True)\n"
        "    return 3\n"
        "end_driver(main)\n", timeout_s=120)
    assert done.returncode == 3, done.stderr[-2000:]
    assert took < 45, took  # Ray's start and stop, not the thread's 60 s
    assert done.stdout.strip().endswith("last line")
    gcs = (tmp_path / "session").read_text()
    assert not reachable(gcs)  # the Ray it started has stopped


def test_a_driver_without_ray_ends_as_python_does():
    done, _ = _run("from sweeps.ending import end_driver\nend_driver(lambda: 4)\n")
    assert done.returncode == 4 and not done.stderr
    done, _ = _run("import sys\nfrom sweeps.ending import end_driver\n"
                   "def main():\n    sys.exit(2)\nend_driver(main)\n")
    assert done.returncode == 2 and not done.stderr
    done, _ = _run("from sweeps.ending import end_driver\nend_driver(lambda: None)\n")
    assert done.returncode == 0


def _stop_watch_script(address: str, grace_s: float = 20, disarm: bool = False) -> str:
    """A driver whose main thread never gets back to Python once SIGTERM comes (its handler
    blocks, as a call into a dead Ray does), with a StopWatch on `address`."""
    return ("import os, signal, threading, time\n"
            "import sweeps.ending as ending\n"
            f"ending.STOP_GRACE_S = {grace_s}\n"
            "signal.signal(signal.SIGTERM, lambda *a: time.sleep(60 if not DISARM else 0))\n"
            f"DISARM = {disarm}\n"
            f"watch = ending.StopWatch({address!r},\n"
            "                          lambda s: f'Continue with: x --resume ({s})')\n"
            "threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM)).start()\n"
            "signal.signal(signal.SIGUSR1, lambda *a: None)  # Tune's stop, asked after it\n"
            "threading.Timer(0.8, os.kill, (os.getpid(), signal.SIGUSR1)).start()\n"
            "time.sleep(1.5)\n"
            "if DISARM:\n"
            "    watch.disarm()\n"
            "    time.sleep(4)\n"
            "    print('went on', flush=True)\n")


def test_after_a_stop_a_lost_gcs_ends_the_driver_at_once_with_the_resume_line():
    closed = f"127.0.0.1:{free_port()}"  # nothing listens: a GCS stopped with the job
    done, took = _run(_stop_watch_script(closed))
    assert done.returncode == 143, done.stderr
    assert took < 15  # GCS_GONE_S after the first failed connection, not STOP_GRACE_S
    assert f"Ray's GCS at {closed} is gone" in done.stderr
    assert "Continue with: x --resume (15)" in done.stderr


def test_after_a_stop_a_driver_held_by_a_live_ray_ends_after_the_grace():
    import socket

    with socket.socket() as server:  # a GCS that answers
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        address = f"127.0.0.1:{server.getsockname()[1]}"
        done, took = _run(_stop_watch_script(address, grace_s=2))
        # disarmed at 1.5 s, 2 s before the countdown's end; the driver then runs past it
        disarmed, _ = _run(_stop_watch_script(address, grace_s=3, disarm=True))
    assert done.returncode == 143, done.stderr
    assert took < 30
    assert "had not let go of the trials 2 s after the signal" in done.stderr
    assert "Ray's GCS" not in done.stderr and "Continue with: x --resume" in done.stderr
    assert "wakeup fd" not in done.stderr + disarmed.stderr  # read to its end, never closed
    # disarmed (every trial had finished before the stop): the driver goes on to its end
    assert disarmed.returncode == 0 and disarmed.stdout == "went on\n", disarmed.stderr


def test_progress_file_counts_finished_trials_and_this_runs_epochs_over_the_experiments(
        tmp_path, monkeypatch):
    # A lambda search runs several experiments; trials finished in earlier runs count as
    # finished, and only epochs trained in this run count as new (a requeued run that
    # restores and finishes one trial made progress, whatever it reports again).
    from sweeps import ending

    monkeypatch.setattr(ending, "_PROGRESS", {})
    monkeypatch.setattr(ending, "_NEW_EPOCHS", [0])
    path = tmp_path / "progress"
    monkeypatch.setenv("SWEEP_PROGRESS_FILE", str(path))
    write_progress("study_a", 2, 1, new_epochs=1)
    assert json.loads(path.read_text()) == {"trials": 2, "finished": 1, "new_epochs": 1}
    write_progress("study_b", 3, 0, new_epochs=2)
    assert json.loads(path.read_text()) == {"trials": 5, "finished": 1, "new_epochs": 3}
    write_progress("study_a", 2, 2)  # a trial ended, no new epoch
    assert json.loads(path.read_text()) == {"trials": 5, "finished": 2, "new_epochs": 3}
    assert not list(tmp_path.glob("*.part"))
    monkeypatch.delenv("SWEEP_PROGRESS_FILE")
    write_progress("study_c", 1, 1, new_epochs=4)  # no file asked: none written
    assert json.loads(path.read_text())["new_epochs"] == 3


def test_the_progress_callback_writes_every_new_epoch_and_skips_restored_ones(tmp_path,
                                                                               monkeypatch):
    from sweeps import ending
    from sweeps.runner import progress_callback

    monkeypatch.setattr(ending, "_PROGRESS", {})
    monkeypatch.setattr(ending, "_NEW_EPOCHS", [0])
    path = tmp_path / "progress"
    monkeypatch.setenv("SWEEP_PROGRESS_FILE", str(path))
    # 3 trials, 1 finished in an earlier run; this run restores a trial's 2 epochs, trains one
    progress = progress_callback(("seed",), 3, n_done=1, experiment="grid")
    trial = SimpleNamespace(trial_id="t", config={"epochs": 3, "point": {"seed": 1}},
                            status="TERMINATED", TERMINATED="TERMINATED")
    for epoch in (1, 2):
        progress.on_trial_result(0, [trial], trial, {"epoch": epoch, "restored": True})
    assert not path.exists()
    progress.on_trial_result(0, [trial], trial, {"epoch": 3, "train_acc": 0.9})
    assert json.loads(path.read_text()) == {"trials": 3, "finished": 1, "new_epochs": 1}
    progress.on_trial_complete(0, [trial], trial)
    assert json.loads(path.read_text()) == {"trials": 3, "finished": 2, "new_epochs": 1}


NODES = [NodeShape("n1", 2, 0), NodeShape("n2", 2, 0)]


def test_a_sweep_no_node_can_place_is_refused_naming_the_ask_and_the_nodes(monkeypatch,
                                                                          capsys):
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    with pytest.raises(SweepError) as refused:
        check_resources("10.0.0.1:20000", 1, 1, NODES)
    message = str(refused.value)
    assert message.startswith("each trial asks 1 CPU and 1 GPU (--cpus-per-trial 1 "
                              "--gpus-per-trial 1), and no node of the Ray at 10.0.0.1:20000")
    assert "n1 has 2 CPUs and 0 GPUs, n2 has 2 CPUs and 0 GPUs" in message
    assert "sbatch --gres=gpu:N or --gpus-per-node=N" in message
    assert "\n" not in message
    assert "Ray at 10.0.0.1:20000: n1 has 2 CPUs and 0 GPUs" in capsys.readouterr().out
    monkeypatch.delenv("SLURM_JOB_ID")
    with pytest.raises(SweepError, match=r"ask fewer CPUs \(--cpus-per-trial\)$"):
        check_resources(None, 4, 0, NODES)


def test_a_sweep_one_node_can_place_passes(capsys):
    nodes = [*NODES, NodeShape("n3", 4, 2)]
    assert check_resources("h:1", 4, 0.5, nodes) == nodes
    assert check_resources(None, 1, 0, NODES) == NODES
    assert capsys.readouterr().out.count("Ray at h:1") == 1  # a local Ray: no line


def test_an_autoscaling_clusters_node_types_count_as_nodes(tmp_path):
    config = tmp_path / "ray_bootstrap_config.yaml"
    config.write_text("available_node_types:\n"
                      "  head: {resources: {CPU: 4}, min_workers: 0, max_workers: 0}\n"
                      "  gpu_worker: {resources: {CPU: 8, GPU: 1}, min_workers: 0, "
                      "max_workers: 4}\n")
    types = autoscaler_node_types(config)
    assert types == [NodeShape("gpu_worker", 8, 1, may_add=True)]
    check_resources("h:1", 1, 1, [NodeShape("head", 4, 0), *types])  # a GPU node may come
    assert autoscaler_node_types(tmp_path / "none.yaml") == []


def test_a_job_whose_nodes_did_not_all_join_stops_naming_them_and_the_head_address():
    # A 4-node job of which only n1 joined must not run on 1 node without a word.
    with pytest.raises(SweepError) as refused:
        check_all_joined("10.0.0.5:20000", ["n1", "n2", "n3", "n4"], [NodeShape("n1", 8, 1)],
                         120)
    message = str(refused.value)
    assert message.startswith("1 of the job's 4 nodes joined the Ray at 10.0.0.5:20000 within "
                              "120 s (SWEEP_NODES_WAIT_S waits longer): n2, n3, n4 did not.")
    assert "was given 10.0.0.5:20000" in message and "SWEEP_HEAD_IP" in message
    assert "\n" not in message
    with pytest.raises(SweepError, match="1 of them did not"):
        check_all_joined("h:1", ["", ""], [NodeShape("n1", 2, 0)], 5)
    check_all_joined("h:1", ["n1", "n2"], NODES, 5)  # all there
    check_all_joined(None, [], NODES, 5)  # not a batch job: nothing expected


def test_the_batch_scripts_node_list_is_read_by_name_or_count(monkeypatch):
    monkeypatch.setenv("SWEEP_EXPECT_NODES", "n1,n2")
    assert expected_nodes() == ["n1", "n2"]
    monkeypatch.setenv("SWEEP_EXPECT_NODES", "3")
    assert expected_nodes() == ["", "", ""]
    monkeypatch.delenv("SWEEP_EXPECT_NODES")
    assert expected_nodes() == []


DEFERRED = """\
import os, signal, sys
from types import SimpleNamespace
from sweeps import signals
signals.defer_stop_signals()
os.kill(os.getpid(), signal.SIGTERM)  # between two Tune runs, or while outputs are written
print("still here", signals.PENDING == [signal.SIGTERM], flush=True)
with signals.StopSignals(SimpleNamespace(out="OUT")) as stop:  # the next run
    print("run starts:", stop.received is None, "stop set:", signals.STOP.is_set(), flush=True)
    stop.exit()
"""


def test_a_stop_signal_outside_a_tune_run_stops_the_next_run_with_the_resume_line():
    proc = subprocess.run([sys.executable, "-c", DEFERRED, "--preset", "x"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.stdout.splitlines() == ["still here True", "run starts: False stop set: True"]
    assert proc.returncode == 143, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[0] == ("SIGTERM received: stopping before the next trials start (send it "
                        "again to stop at once)")
    assert lines[-1].startswith("stopped by SIGTERM; the finished epochs are saved in OUT. "
                                "Continue with: python ")
    assert lines[-1].endswith("--preset x --resume"), lines[-1]
