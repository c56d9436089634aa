"""`--tracker wandb`: a real sweep logged offline, its run files read back (the
sweeps run in tests/test_tracking.py, logged to MLflow and W&B at once)."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("wandb", reason="the wandb extra: pip install -e '.[wandb]'")

from tests.drivers import run_main  # noqa: E402
from tests.wandb_files import offline_history, offline_records  # noqa: E402


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


@pytest.mark.ray
@pytest.mark.parametrize("args, needle", [
    (["--wandb-project", "p"], "--wandb-project: only read with --tracker wandb"),
    (["--tracker", "neptune"], "unknown tracker"),
])
def test_tracker_flags_are_checked_before_ray(args, needle, tmp_path):
    proc = run_main("digits_grid", *args, "--out", str(tmp_path / "o"))  # tests/drivers.py
    assert proc.returncode == 2 and needle in proc.stderr.strip().splitlines()[-1]


def _children() -> set[str]:
    """The processes this one started and that still run (of every thread)."""
    children: set[str] = set()
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        try:
            children.update((task / "children").read_text().split())
        except FileNotFoundError:  # a thread that ended since the listing
            pass
    return children


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads /proc (Linux)")
def test_every_point_is_a_run_of_its_own_written_out_when_the_experiment_ends(
        tmp_path, monkeypatch, capfd):
    """The callback as Tune drives it, with stand-in trials: a plain trial and a two-member
    bundle are three runs open at once in this process, each with its own epochs. At the
    experiment's end every run file is whole and wandb-core has exited (the driver may exit
    at once: a SIGTERM'd sweep does). A run wandb refuses is a warning line, and the others
    go on."""
    from types import SimpleNamespace

    from sweeps.trackers.wandb_runs import _trial_runs_callback
    from unbiased.trial import MEMBERS_KEY

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    before = _children()
    state = {"project": "p", "group": "g", "dir": str(tmp_path)}
    callback = _trial_runs_callback()(state, ("lam",))
    plain = SimpleNamespace(trial_id="t1", config={"method": "mi_backprop", "lam": 1.0})
    bundle = SimpleNamespace(trial_id="t2", config={"method": "erm", MEMBERS_KEY: [
        {"lam": 0.0, "seed": 0}, {"lam": 0.0, "seed": 1}]})
    refused = SimpleNamespace(trial_id="t3", config={"method": "erm", "lam": 0.5})
    for trial in (plain, bundle):
        callback.log_trial_start(trial)
    callback.state = {**state, "project": "no/slashes/allowed"}
    callback.log_trial_start(refused)
    callback.state = state
    for epoch in (1, 2):
        callback.log_trial_result(epoch, plain, {"epoch": epoch, "test_acc": epoch / 10,
                                                 "training_iteration": epoch})
        callback.log_trial_result(epoch, refused, {"epoch": epoch, "test_acc": 0.9})
        # the bundle's second member diverged at epoch 2: it reports nothing more
        member = {"m0/epoch": epoch, "m0/test_acc": 0.5 + epoch / 10, "training_iteration": epoch}
        if epoch == 1:
            member |= {"m1/epoch": 1, "m1/test_acc": 0.3}
        callback.log_trial_result(epoch, bundle, member)
    callback.log_trial_end(plain)  # the bundle's runs are still open at the end
    callback.on_experiment_end([plain, bundle, refused])

    assert not _children() - before, "wandb-core still running"
    runs = {}
    for path in (tmp_path / "wandb").glob("offline-run-*/run-*.wandb"):
        run_id, history = offline_history(path)
        runs[run_id] = {step: m["test_acc"] for step, m in history.items()}
    # a point's run is named by its record's key (a trial without a point: Tune's id)
    assert runs == {"t1": {1: 0.1, 2: 0.2}, "lam=0.0_seed=0": {1: 0.6, 2: 0.7},
                    "lam=0.0_seed=1": {1: 0.3}}
    warnings = [line for line in capfd.readouterr().err.splitlines() if "W&B run" in line]
    assert len(warnings) == 1 and warnings[0].startswith("warning: W&B run t3: start failed")
