"""`--tracker mlflow` against real MLflow: a local store and a real server; the
same sweeps log to W&B offline where its extra is installed."""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import pytest

mlflow = pytest.importorskip("mlflow", reason="the mlflow extra: pip install -e '.[mlflow]'")
from mlflow.tracking import MlflowClient  # noqa: E402

from tests.conftest import SMALL_NET  # noqa: E402
from tests.drivers import run_main  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DRIVER = ROOT / "sweeps" / "digits_grid.py"
# What is logged, not how well it learns: the small net (tests/conftest.py).
TINY = ["--sigma", "0.03", "--seeds", "0", "--K", "2", "--batch-size", "256",
        "--mi-eval-steps", "20", "--device", "cpu", "--cpus-per-trial", "1", *SMALL_NET]


def _driver(*args: str, env: dict | None = None, timeout: int = 300
            ) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(DRIVER), *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=timeout, env=env)


def _trial_runs(client: MlflowClient, out: Path) -> tuple[str, list]:
    """The parent run's id and its nested trial runs, found by experiment name (OUT's)."""
    experiment = client.get_experiment_by_name(out.resolve().name)
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1, [r.info.run_name for r in parents]
    parent = parents[0].info.run_id
    trials = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent]
    return parent, trials


def _check_histories(client: MlflowClient, trials: list, df: pd.DataFrame,
                     timings: bool = True) -> None:
    """Each trial run's per-epoch histories are results.parquet's rows of that trial.
    `timings`: also the seconds (an epoch re-run after a stop keeps its first report in
    MLflow and its last in results.parquet: the same numbers, other seconds)."""
    assert {r.data.tags["trial_id"] for r in trials} == set(df["trial_id"])
    for run in trials:
        rows = df[df["trial_id"] == run.data.tags["trial_id"]].sort_values("epoch")
        for metric in ("test_acc", "train_acc", "mi", "time_s", "epoch_s"):
            history = sorted(client.get_metric_history(run.info.run_id, metric),
                             key=lambda m: m.step)
            assert [m.step for m in history] == rows["epoch"].tolist(), metric
            if timings or not metric.endswith("_s"):
                assert [m.value for m in history] == rows[metric].tolist(), metric
        # mi_eval exists only at the epochs that estimated it: no NaN points
        history = client.get_metric_history(run.info.run_id, "mi_eval")
        assert sorted(m.step for m in history) == rows.loc[rows["mi_eval"].notna(),
                                                           "epoch"].tolist()


def _trackers() -> str:
    """Both trackers where the wandb extra is installed (`make test` installs it), else
    MLflow's alone: one sweep checks each tracker it logs to."""
    try:
        import wandb  # noqa: F401
    except ImportError:
        return "mlflow"
    return "mlflow,wandb"


@pytest.mark.system  # trackers
def test_sweep_logs_one_run_per_trial_with_histories_tags_and_artifacts(ray_local, tmp_path,
                                                                       capsys, monkeypatch):
    """MLflow's local store here; W&B's offline run files (tests/test_wandb.py reads them)
    from the same sweep."""
    from sweeps.digits_grid import main

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    trackers = _trackers()
    out = tmp_path / "tracked"
    rc = main([*TINY, "--lam", "0,1", "--epochs", "2", "--tracker", trackers,
               "--out", str(out)])
    assert rc == 0
    # The last lines say how to look at the sweep, with commands that work on OUT as written.
    lines = capsys.readouterr().out.strip().splitlines()
    if "wandb" in trackers:
        from tests.test_wandb import check_offline_runs

        wandb_line = lines.pop()
        assert wandb_line.startswith(f"W&B: offline runs in {out / 'wandb'}; upload: wandb sync ")
        check_offline_runs(out, pd.read_parquet(out / "results.parquet"))
    tensorboard, ui = lines[-2:]
    logdir = Path(shlex.split(tensorboard.split(": ", 1)[1])[-1])
    assert tensorboard.startswith("TensorBoard: tensorboard --logdir ")
    assert any(logdir.rglob("events.out.tfevents.*"))  # Tune's event files, not /tmp/ray
    assert ui.startswith("MLflow: mlflow ui --backend-store-uri ")
    uri = shlex.split(ui)[-1]
    df = pd.read_parquet(out / "results.parquet")
    client = MlflowClient(tracking_uri=uri)
    parent, trials = _trial_runs(client, out)
    assert len(trials) == df["trial_id"].nunique() == 2
    _check_histories(client, trials, df)
    for run in trials:
        tags, params = run.data.tags, run.data.params
        rows = df[df["trial_id"] == tags["trial_id"]]
        assert float(tags["lam"]) == rows["lam"].iloc[0] == float(params["lam"])
        assert tags["method"] == "mi_backprop" and float(tags["sigma"]) == 0.03
        assert tags["seed"] == "0" and tags["K"] == "2" and params["epochs"] == "2"
        assert params["batch_size"] == "256"  # the whole flat config, not only the point
        assert int(tags["selected_epoch"]) == int(rows.loc[rows["selected"], "epoch"].iloc[0])
        assert run.info.status == "FINISHED"
    names = {a.path for a in client.list_artifacts(parent)}
    assert {"results.parquet", "table.md", "table.parquet", "figures"} <= names
    assert client.list_artifacts(parent, "figures")
    assert client.get_run(parent).info.status == "FINISHED"


def _stop_after(args: list[str], needle: str, deadline_s: float = 300) -> str:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, str(DRIVER), *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    seen = []
    try:
        deadline = time.time() + deadline_s
        for line in proc.stdout:
            seen.append(line)
            if needle in line:
                break
            assert time.time() < deadline, "no such line in time: " + "".join(seen[-20:])
        proc.send_signal(signal.SIGTERM)
        seen.append(proc.stdout.read())
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 128 + signal.SIGTERM, "".join(seen)[-3000:]
    return "".join(seen)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def _mlflow_server(tmp_path: Path) -> Iterator[str]:
    """A real `mlflow server` on a free local port: its URI, once it answers."""
    port = _free_port()
    uri = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
         "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}",
         "--artifacts-destination", str(tmp_path / "server-artifacts"), "--workers", "1"],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)
    try:
        deadline = time.time() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=2) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                pass
            assert server.poll() is None, "mlflow server exited"
            assert time.time() < deadline, "mlflow server did not answer in 120 s"
            time.sleep(1)
        yield uri
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=30)


@pytest.mark.system  # a server, a signal
def test_resume_continues_the_same_runs_on_a_real_mlflow_server_and_wandb(ray_local, tmp_path,
                                                                          monkeypatch):
    """One sweep logged over HTTP to a real `mlflow server` (and to W&B offline,
    tests/test_wandb.py reads its run files), stopped by SIGTERM and resumed: the resume logs
    where the sweep was started, into the same runs. The resume runs in this process, on the
    session's Ray (tests/drivers.py)."""
    trackers = _trackers()
    monkeypatch.setenv("WANDB_MODE", "offline")  # the driver below inherits it
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "stopped"
    args = [*TINY, "--lam", "0,1", "--epochs", "3", "--out", str(out)]
    with _mlflow_server(tmp_path) as uri:
        _stop_after([*args, "--tracker", trackers, "--tracking-uri", uri], "epoch 2/3")
        # without --tracker: the sweep logs where it was started (OUT/mlflow.json, wandb.json)
        resumed = run_main("digits_grid", *args, "--resume")
        assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
        assert "resume: logging to MLflow" in resumed.stdout
        df = pd.read_parquet(out / "results.parquet")
        if "wandb" in trackers:
            from tests.test_wandb import check_runs, runs_of

            assert "resume: logging to W&B project" in resumed.stdout
            runs = runs_of(out)
            assert len([r for r in runs if not r.endswith("-summary")]) == 2  # the same ids
            check_runs(runs, df)
        assert not (out / "mlflow.db").exists()  # everything went to the server
        assert resumed.stdout.strip().splitlines()[-1 - (trackers != "mlflow")] == (
            f"MLflow: {uri}, experiment {out.name!r}")
        client = MlflowClient(tracking_uri=uri)
        parent, trials = _trial_runs(client, out)
        assert len(trials) == 2  # the runs of the first start, continued: no duplicates
        _check_histories(client, trials, df, timings=False)
        assert "table.md" in {a.path for a in client.list_artifacts(parent)}


@pytest.mark.parametrize("module, trackers, message", [
    ("mlflow", "mlflow", "error: --tracker mlflow needs MLflow"),
    ("wandb", "mlflow,wandb", "error: --tracker wandb needs wandb"),
])
def test_without_the_extra_the_tracker_flag_is_one_line_before_ray(module, trackers, message,
                                                                    tmp_path):
    hide = tmp_path / f"no_{module}"
    hide.mkdir()
    # An import that fails as it does where the extra is not installed.
    (hide / f"{module}.py").write_text(
        f"raise ModuleNotFoundError(\"No module named '{module}'\")\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hide), str(ROOT)])}
    out = tmp_path / "out"
    proc = _driver(*TINY, "--tracker", trackers, "--out", str(out), env=env, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message)
    assert f"[{module}]" in lines[0]
    assert not out.exists()


def test_tracking_uri_without_the_tracker_is_refused(tmp_path):
    proc = run_main("digits_grid", "--tracking-uri", "http://127.0.0.1:1", "--out",
                    str(tmp_path / "o"))  # in this process (tests/drivers.py)
    assert proc.returncode == 2 and "--tracking-uri" in proc.stderr.strip().splitlines()[-1]
