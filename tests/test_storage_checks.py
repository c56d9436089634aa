"""Trial state every node can reach, checked before anything starts: on a cluster
(--address) a storage URI or --shared-storage; a URI of a known form; a bucket this machine
can reach. Each refusal is one `error:` line, exit status 2, nothing written."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.drivers import run_main

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _no_storage_env(monkeypatch):
    monkeypatch.delenv("UNBIASED_STORAGE_PATH", raising=False)


@pytest.mark.parametrize("flags, needle", [
    (["--address", "auto"], "(the default) is a directory of this machine"),
    (["--address", "auto", "--storage-path", "/mnt/nowhere"],
     "/mnt/nowhere is a directory of this machine"),
    (["--storage-path", "s3://"], "no bucket after s3://"),
    (["--storage-path", "s3:///run"], "no bucket after s3://"),
    (["--storage-path", "ftp://host/run"], "ftp:// is not a storage Tune writes to"),
])
def test_storage_no_node_could_use_is_one_error_line(flags, needle, tmp_path):
    out = tmp_path / "out"
    ran = run_main("digits_grid", *flags, "--out", str(out))
    assert ran.returncode == 2
    last = ran.stderr.strip().splitlines()[-1]
    assert "error: argument --storage-path:" in last and needle in last, last
    assert not out.exists()


def test_a_path_every_node_mounts_is_accepted_when_said_so(tmp_path):
    ran = run_main("digits_grid", "--address", "auto", "--shared-storage", "--dry-run",
                   "--out", str(tmp_path / "out"))
    assert ran.returncode == 0, ran.stderr
    ran = run_main("digits_grid", "--address", "auto", "--storage-path", "s3://bucket/run",
                   "--dry-run", "--out", str(tmp_path / "out"))
    assert ran.returncode == 0, ran.stderr


def test_a_bucket_that_cannot_be_reached_is_one_error_line_before_ray(tmp_path):
    with socket.socket() as s:  # a port nobody listens on, as the S3 endpoint
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_ADDRESS", "UNBIASED_STORAGE_PATH")}
    env.update(AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}", AWS_ACCESS_KEY_ID="test",
               AWS_SECRET_ACCESS_KEY="test", AWS_DEFAULT_REGION="us-east-1")
    out = tmp_path / "out"
    ran = subprocess.run([sys.executable, str(ROOT / "sweeps" / "digits_grid.py"),
                          "--storage-path", "s3://bucket/run", "--epochs", "1", "--out",
                          str(out)], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120)
    assert ran.returncode == 2, ran.stderr[-2000:]
    last = ran.stderr.strip().splitlines()[-1]
    assert last.startswith("error: --storage-path s3://bucket/run: cannot reach it"), last
    assert "Traceback" not in ran.stderr and "Started a local Ray" not in ran.stdout
    assert not out.exists()


@pytest.mark.ray
def test_the_outputs_outlive_the_machine_and_a_resume_rebuilds_them(ray_local, tmp_path):
    """Outputs copied under the storage path (here a file:// URI, through pyarrow as S3 is):
    with the machine's OUT gone (a head after `ray down`), --resume rebuilds them from Tune's
    state in the storage alone."""
    import pandas as pd

    from tests.conftest import SMALL_NET

    out = tmp_path / "head" / "sweep"
    args = ["--sigma", "0.03", "--seeds", "0", "--lam", "0,1", "--K", "2", "--epochs", "1",
            "--batch-size", "256", "--mi-eval-steps", "20", "--device", "cpu", *SMALL_NET,
            "--storage-path", f"file://{tmp_path / 'bucket'}", "--out", str(out)]
    ran = run_main("digits_grid", *args)
    assert ran.returncode == 0, ran.stderr[-2000:]
    kept = tmp_path / "bucket" / "sweep" / "outputs"
    assert f"and copied them to file://{kept}" in ran.stdout
    for name in ("results.parquet", "table.md", "table.parquet", "table.tex",
                 "experiment.json"):
        assert (kept / name).read_bytes() == (out / name).read_bytes(), name
    assert list((kept / "figures").glob("*.png"))
    before = pd.read_parquet(out / "results.parquet")

    import shutil

    shutil.rmtree(tmp_path / "head")  # the head's disk, gone with `ray down`
    resumed = run_main("digits_grid", *args, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    after = pd.read_parquet(out / "results.parquet")
    cols = ["trial_id", "epoch", "lam", "test_acc", "mi"]
    assert after[cols].sort_values("trial_id").reset_index(drop=True).equals(
        before[cols].sort_values("trial_id").reset_index(drop=True))
    assert (out / "table.md").is_file()


@pytest.mark.parametrize("flags, expected", [
    ([], 2), (["--address", "auto", "--shared-storage"], 10),
    (["--address", "auto", "--shared-storage", "--max-failures", "4"], 4),
    (["--max-failures", "0"], 0)])
def test_a_clusters_trials_get_more_restarts_than_a_local_sweeps(flags, expected):
    from sweeps.cli import build_parser, resolve
    from sweeps.digits_grid import GRID
    from sweeps.presets import DIGITS

    parser = build_parser(GRID.prog, GRID.description, DIGITS, **GRID.parser_options)
    assert resolve(parser, "digits", DIGITS, flags).max_failures == expected
