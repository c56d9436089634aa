"""`--tracker wandb` (issue 30): a real sweep logged offline, its run files read back."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("wandb", reason="the wandb extra: pip install -e '.[wandb]'")

from sweeps.trackers.wandb_runs import offline_history, offline_records  # noqa: E402
from tests.test_tracking import TINY, _driver  # noqa: E402


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


def test_sweep_logs_one_offline_run_per_trial_and_a_summary(ray_local, tmp_path, monkeypatch,
                                                          capsys):
    from sweeps.digits_grid import main

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "wb"
    rc = main([*TINY, "--lam", "0,1", "--epochs", "2", "--tracker", "wandb", "--out",
               str(out)])
    assert rc == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith(f"W&B: offline runs in {out / 'wandb'}; upload: wandb sync ")
    df = pd.read_parquet(out / "results.parquet")
    check_runs(runs_of(out), df)
    files = sorted((out / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 3  # two trials and the summary
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
            assert f"lam={row['lam']}" in run.tags and "method=mi_backprop" in run.tags
            config = {i.key for i in run.config.update}
            assert {"batch_size", "lam", "sigma", "seed", "epochs"} <= config


@pytest.mark.parametrize("args, needle", [
    (["--wandb-project", "p"], "--wandb-project: only read with --tracker wandb"),
    (["--tracker", "neptune"], "unknown tracker"),
])
def test_tracker_flags_are_checked_before_ray(args, needle, tmp_path):
    proc = _driver(*args, "--out", str(tmp_path / "o"), timeout=120)
    assert proc.returncode == 2 and needle in proc.stderr.strip().splitlines()[-1]
