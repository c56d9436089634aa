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


@pytest.mark.ray
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


@pytest.mark.ray
def test_a_path_every_node_mounts_is_accepted_when_said_so(tmp_path):
    ran = run_main("digits_grid", "--address", "auto", "--shared-storage", "--dry-run",
                   "--out", str(tmp_path / "out"))
    assert ran.returncode == 0, ran.stderr
    ran = run_main("digits_grid", "--address", "auto", "--storage-path", "s3://bucket/run",
                   "--dry-run", "--out", str(tmp_path / "out"))
    assert ran.returncode == 0, ran.stderr


@pytest.mark.ray
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
def test_a_storage_that_never_answers_is_one_error_line_within_seconds(tmp_path):
    """An endpoint that takes the connection and never answers (offline, as GCS without
    credentials looked: over 150 s of silence): pyarrow's client would retry for minutes,
    the check gives up at its limit. The driver's `main` in this process: the check's own
    process is the one that waits, and is killed."""
    import time

    from sweeps.outputs import STORAGE_CHECK_S

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)  # connections queue up, nothing ever reads them
        port = server.getsockname()[1]
        uri = f"gs://bucket/run?endpoint_override=127.0.0.1:{port}&scheme=http"
        out = tmp_path / "out"
        start = time.monotonic()
        ran = run_main("digits_grid", "--storage-path", uri, "--epochs", "1", "--out",
                       str(out))
        took = time.monotonic() - start
    assert ran.returncode == 2, ran.stderr[-2000:]
    assert ran.stderr.strip().splitlines() == [
        f"error: --storage-path {uri}: cannot reach it: no answer within "
        f"{STORAGE_CHECK_S:g} s (the endpoint, the network or the credentials)"], ran.stderr
    assert STORAGE_CHECK_S <= took < STORAGE_CHECK_S + 5, took
    assert not out.exists()


@pytest.mark.ray
@pytest.mark.system  # a server, a signal
def test_a_sweep_on_s3_stopped_by_sigterm_resumes_from_the_bucket_alone(tmp_path):
    """The trials' records in a bucket of a real S3 API (tests/s3.py). A sweep stopped by
    SIGTERM mid-trial, with the machine's OUT then gone (a head after `ray down`), resumes
    from the bucket alone: each trial goes on from its checkpoint, read back from the
    bucket, one of them though the bucket holds a checkpoint its rows do not name (a kill
    between the upload of a checkpoint and of the rows leaves that); every epoch is reported
    once; the outputs land in the bucket as well."""
    import shutil
    import signal
    import time

    import pandas as pd

    from tests.conftest import SMALL_NET
    from tests.s3 import BUCKET, s3_server

    out = tmp_path / "head" / "sweep"
    # Epochs of a second or two each: the stop gives the trials up to 10 s, so each needs
    # enough of them left at the signal to still be unfinished when it lands.
    epochs = 10
    args = [str(ROOT / "sweeps" / "digits_grid.py"), "--sigma", "0.03", "--seeds", "0",
            "--lam", "0,1", "--K", "2", "--epochs", str(epochs), "--batch-size", "256",
            "--mi-eval-steps", "20", "--device", "cpu", *SMALL_NET,
            "--storage-path", f"s3://{BUCKET}/runs", "--out", str(out)]
    experiment = f"runs/{out.name}/digits_grid"
    with s3_server(tmp_path) as s3:
        env = {k: v for k, v in os.environ.items()
               if k not in ("RAY_ADDRESS", "UNBIASED_STORAGE_PATH")}
        env.update(s3.env, PYTHONUNBUFFERED="1")
        driver = subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  start_new_session=True)
        seen = []
        try:
            # Both trials past their second checkpoint, seen in the bucket (the driver's
            # output lags behind the trials): each resumes from epoch 2 or later.
            deadline = time.time() + 300
            while min(s3.checkpointed_epochs(experiment).values(), default=0) < 2 or len(
                    s3.checkpointed_epochs(experiment)) < 2:
                assert driver.poll() is None, driver.stdout.read()[-3000:]
                assert time.time() < deadline, "the trials did not checkpoint in time"
                time.sleep(0.2)
            driver.send_signal(signal.SIGTERM)
            seen.append(driver.stdout.read())
            driver.wait(timeout=120)
        finally:
            if driver.poll() is None:
                os.killpg(driver.pid, signal.SIGKILL)
                driver.wait()
        assert driver.returncode == 128 + signal.SIGTERM, "".join(seen)[-3000:]
        saved = s3.checkpointed_epochs(experiment)
        unfinished = {trial for trial, epoch in saved.items() if epoch < epochs}
        assert len(saved) == 2 and unfinished, saved  # something left to resume
        shutil.rmtree(tmp_path / "head", ignore_errors=True)  # the head's disk, gone
        assert not out.exists()
        # And the window a kill can land in (test_reliability.py's SIGKILL test has it on
        # disk): a checkpoint uploaded, the rows naming it not.
        window = sorted(unfinished)[0]
        bucket = s3.filesystem()
        ahead = f"{BUCKET}/{experiment}/trials/{window}/checkpoint/{saved[window] + 1:06d}"
        with bucket.open_output_stream(f"{ahead}/state.pt") as stream:
            stream.write(b"a checkpoint whose rows never came")
        read_before = len(s3.requests("GET", "/checkpoint/"))
        resumed = subprocess.run([sys.executable, *args, "--resume"], cwd=ROOT, env=env,
                                 capture_output=True, text=True, timeout=600)
        assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
        assert len(s3.requests("GET", "/checkpoint/")) > read_before  # read from the bucket
        df = pd.read_parquet(out / "results.parquet")
        reported = df.groupby("trial_id")["epoch"].apply(lambda e: tuple(sorted(e)))
        assert len(reported) == 2, reported
        assert all(e == tuple(range(1, epochs + 1)) for e in reported), reported
        # Each trial unfinished at the stop went on from its last checkpoint in the bucket
        # (or a later one it wrote while the stop landed), not afresh.
        started = df.groupby("trial_id")["start_epoch"].max()
        assert unfinished <= set(started.index), (started, saved)
        assert all(saved[key] + 1 <= started[key] for key in unfinished), (started, saved)
        kept = {k.split("/outputs/", 1)[1] for k in s3.keys(f"runs/{out.name}/outputs")}
        assert {"results.parquet", "table.md", "table.parquet", "table.tex",
                "experiment.json"} <= kept
        assert any(k.startswith("figures/") for k in kept)
        copied = s3.filesystem().open_input_file(f"{BUCKET}/runs/{out.name}/outputs/"
                                                 "results.parquet").read()
        assert copied == (out / "results.parquet").read_bytes()


@pytest.mark.parametrize("flags, expected", [
    ([], 2), (["--address", "auto", "--shared-storage"], 10),
    (["--address", "auto", "--shared-storage", "--max-failures", "4"], 4),
    (["--max-failures", "0"], 0)])
def test_a_clusters_trials_get_more_restarts_than_a_local_sweeps(flags, expected):
    from sweeps.cli import build_parser, resolve
    from sweeps.digits_grid import GRID
    from unbiased.benchmarks.digits.spec import DIGITS

    parser = build_parser(GRID.prog, GRID.bench.description, DIGITS, benchmark=GRID.bench)
    assert resolve(parser, "digits", DIGITS, flags).max_failures == expected


@pytest.mark.ray
def test_a_sweep_started_as_a_ray_job_joins_the_jobs_cluster_under_its_storage_rule(
        tmp_path, monkeypatch):
    """`ray job submit ... -- python sweeps/digits_grid.py ...`: Ray's job supervisor gives
    the entrypoint the job's config and the cluster's address; the sweep joins that cluster
    (its trials then run in the job's uploaded working directory) as with --address."""
    from sweeps.cli import build_parser, resolve
    from sweeps.digits_grid import GRID
    from unbiased.benchmarks.digits.spec import DIGITS

    parser = build_parser(GRID.prog, GRID.bench.description, DIGITS, benchmark=GRID.bench)
    assert resolve(parser, "digits", DIGITS, []).address is None  # not a job: a local Ray
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", '{"runtime_env": {}}')
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    job = resolve(parser, "digits", DIGITS, ["--storage-path", "s3://bucket/run"])
    assert job.address == "10.0.0.1:6379" and job.max_failures == 10
    assert resolve(parser, "digits", DIGITS, ["--address", "auto", "--shared-storage"]
                   ).address == "auto"  # an explicit --address wins
    out = tmp_path / "out"
    ran = run_main("digits_grid", "--out", str(out))
    assert ran.returncode == 2 and not out.exists()
    last = ran.stderr.strip().splitlines()[-1]
    assert "the trials of the Ray job's cluster may run on nodes that cannot see it" in last
