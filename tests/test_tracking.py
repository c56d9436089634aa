"""`--tracker mlflow` against real MLflow, and W&B offline where its extra is installed: the
helpers that read what a sweep logged, and the flag checks. The sweeps that log run in
test_bundle_sweep.py (a local store: a run per grid point, bundled or not, with tags, params,
histories and artifacts) and test_group_signal.py (a real `mlflow server`: a sweep stopped by
SIGTERM resumes into the same runs)."""

from __future__ import annotations

import http.client
import os
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
from tests.processes import free_port, stop_group  # noqa: E402

# Each test runs a sweep driver or a Ray: the integration tier.
pytestmark = pytest.mark.ray

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
            logged = rows[rows[metric].notna()]  # NaN is not logged (hsic's mi)
            assert [m.step for m in history] == logged["epoch"].tolist(), metric
            if timings or not metric.endswith("_s"):
                assert [m.value for m in history] == logged[metric].tolist(), metric
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


@contextmanager
def _mlflow_server(tmp_path: Path) -> Iterator[str]:
    """A real `mlflow server` on a free local port: its URI, once it answers. The port is free
    when picked, not when the server binds it: a Ray started meanwhile by the other test worker
    can take it (its gRPC answered the health check in binary, BadStatusLine), and then the
    server exits on the taken port. That is retried on another port, three tries."""
    # Without its job runner: seven polling processes that kept ~2 cores busy for as long as
    # the server ran (docs/MEASURED.md, "The test suite's time"); tracking needs none.
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    for attempt in range(3):
        port = free_port()
        uri = f"http://127.0.0.1:{port}"
        server = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port",
             str(port), "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}",
             "--artifacts-destination", str(tmp_path / "server-artifacts"), "--workers", "1"],
            cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)
        try:
            if _answers(uri, server):
                yield uri
                return
        finally:
            stop_group(server)
        assert attempt < 2, "mlflow server exited three times (ports taken?)"


def _answers(uri: str, server: subprocess.Popen) -> bool:
    """Whether the server at `uri` answers its health check within 120 s (False: it exited,
    e.g. on a port something else took)."""
    deadline = time.time() + 120
    while True:
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=2) as reply:
                if reply.status == 200:
                    return True
        except (OSError, http.client.HTTPException):  # not up, or another server's port
            pass
        if server.poll() is not None:
            return False
        assert time.time() < deadline, "mlflow server did not answer in 120 s"
        time.sleep(1)


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
