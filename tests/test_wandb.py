"""`--tracker wandb`: a real sweep logged offline, its run files read back (the
sweeps run in tests/test_tracking.py, logged to MLflow and W&B at once)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("wandb", reason="the wandb extra: pip install -e '.[wandb]'")

from sweeps.trackers.wandb_runs import offline_history, offline_records  # noqa: E402
from tests.drivers import run_main  # noqa: E402
from tests.test_tracking import ROOT  # noqa: E402


def runs_of(out: Path) -> dict[str, dict[int, dict[str, float]]]:
    """Every offline run under OUT/wandb by run id; a run continued by --resume has a file
    per start, merged here by step as `wandb sync` merges them into one run."""
    runs: dict[str, dict[int, dict[str, float]]] = {}
    for path in sorted((out / "wandb").glob("offline-run-*/run-*.wandb")):
        run_id, history = offline_history(path)
        merged = runs.setdefault(run_id, {})
        for step, metrics in history.items():
            merged.setdefault(step, {}).update(metrics)
    return runs


def check_runs(runs: dict, df: pd.DataFrame) -> None:
    """One run per trial (plus the summary run), each trial's test_acc and train_acc
    histories results.parquet's."""
    trials = {k: v for k, v in runs.items() if not k.endswith("-summary")}
    assert set(trials) == set(df["trial_id"])
    for trial_id, history in trials.items():
        rows = df[df["trial_id"] == trial_id].sort_values("epoch")
        for metric in ("test_acc", "train_acc"):
            logged = {step: m[metric] for step, m in history.items() if metric in m}
            assert logged == dict(zip(rows["epoch"], rows[metric], strict=True)), metric


def check_offline_runs(out: Path, df: pd.DataFrame) -> None:
    """A finished sweep's offline run files (tests/test_bundle_sweep.py runs the sweep, logged
    to MLflow and W&B at once): one run per trial, tagged and configured, plus the summary run
    with the results artifact."""
    check_runs(runs_of(out), df)
    files = sorted((out / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == df["trial_id"].nunique() + 1  # the trials and the summary
    for path in files:
        records = list(offline_records(path))
        (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
        assert run.run_group == out.name and run.project == out.name
        if run.run_id.endswith("-summary"):
            assert run.job_type == "analysis"
            (results,) = [r.artifact for r in records
                          if r.WhichOneof("record_type") == "artifact"
                          and r.artifact.type == "results"]
            assert {"results.parquet", "table.md", "table.tex", "table.parquet"} <= {
                m.path for m in results.manifest.contents}
        else:
            row = df[df["trial_id"] == run.run_id].iloc[0]
            assert f"lam={row['lam']}" in run.tags and f"method={row['method']}" in run.tags
            config = {i.key for i in run.config.update}
            assert {"batch_size", "lam", "sigma", "seed", "epochs"} <= config


@pytest.mark.parametrize("args, needle", [
    (["--wandb-project", "p"], "--wandb-project: only read with --tracker wandb"),
    (["--tracker", "neptune"], "unknown tracker"),
])
def test_tracker_flags_are_checked_before_ray(args, needle, tmp_path):
    proc = run_main("digits_grid", *args, "--out", str(tmp_path / "o"))  # tests/drivers.py
    assert proc.returncode == 2 and needle in proc.stderr.strip().splitlines()[-1]


# One trial's logging actor as Ray runs it (its class, fed by a list in place of Ray's queue
# actor), then what Ray does once run() returns: kill the actor's child processes and the
# actor. It prints the child processes still alive at that moment.
ACTOR_LIFE = """
import os, signal, sys
from pathlib import Path
from sweeps.ray_private import wandb_queue_items
from sweeps.trackers.wandb_runs import _epoch_actor

class Items:
    def __init__(self, items):
        self.items = list(items)
    def get(self):
        return self.items.pop(0)

out = sys.argv[1]
item = wandb_queue_items()
items = [(item.RESULT, {"epoch": e, "test_acc": e / 10}) for e in (1, 2)]
actor = _epoch_actor()(
    logdir=out, queue=Items([*items, (item.END, None)]), exclude=[], to_config=[],
    id="t1", project="p", dir=out, mode="offline")
actor.run()
children = [pid for task in Path(f"/proc/{os.getpid()}/task").iterdir()
            for pid in (task / "children").read_text().split()]
print("alive after run:", children, flush=True)
for pid in children:
    os.kill(int(pid), signal.SIGKILL)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.system
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads /proc (Linux)")
def test_a_trials_run_file_is_whole_when_its_logging_actor_returns(tmp_path):
    """Ray kills a logging actor and its children (wandb-core) as soon as run() returns;
    wandb.finish() alone left wandb-core running with the run file not yet written out."""
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", ACTOR_LIFE, str(tmp_path)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=180)
    assert "alive after run: []" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]
    (path,) = (tmp_path / "wandb").glob("offline-run-*/run-t1.wandb")
    run_id, history = offline_history(path)
    assert run_id == "t1"
    assert {step: m["test_acc"] for step, m in history.items()} == {1: 0.1, 2: 0.2}
