"""A sweep as Slurm jobs, on a real Slurm started here (tests/slurm_cluster.py: munged,
slurmctld and two slurmd on this host, 2 CPUs and 2 GPUs as GRES a node). Where Slurm cannot be
started, the test fails saying why.

One scenario, two jobs side by side on the same two nodes (each 1 CPU of a node's 2),
`sbatch slurm/sweep.sbatch sweeps/digits_grid.py ...`:
- A meets its walltime: Slurm's early signal reaches the batch script, the driver saves, Ray
  stops, the job requeues itself, and its second run, on a new Ray, resumes: every epoch once.
- B is stopped by hand with the same signal (`scancel --batch --signal=USR1`): it ends with
  the driver's 143, not requeued, and the line its log ends with, run as printed, finishes it.
Each job's Ray has ports and directories of its own; neither disturbs the other; each
trial's rows name the Slurm node it ran on, and both nodes ran trials; each finished job ends
within 30 s of its driver's last line.

The walltime is brought forward once A has a checkpoint (`scontrol update TimeLimit`), and
set back while the requeued job waits: Slurm checks time limits every 30 s and --time has a
1-minute floor, so a sweep sized to meet a fixed walltime mid-run would take minutes more, or
race it. The signal, the stop, the requeue and the resume are Slurm's and the script's.
The other jobs (GPUs, refusals, ports, cancels, requeue limits): tests/test_slurm_jobs.py.
"""

from __future__ import annotations

import math
import re
import shlex
import time
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import SMALL_NET
from tests.processes import with_text
from tests.slurm_cluster import NODES, ROOT, Slurm, slurm_fixture  # noqa: F401 (`slurm`)

# Daemons, signals, Ray clusters the jobs start (conftest's RAY_TMPDIR check cannot see them)
pytestmark = [pytest.mark.ray, pytest.mark.system, pytest.mark.slow]

SCRIPT = ROOT / "slurm" / "sweep.sbatch"
# Two trials, one on each node (a job gets 1 CPU on each). A's run long enough that the
# walltime, brought forward after its first checkpoint, falls mid-sweep (Slurm signals at its
# next 30-s check).
SWEEP = ["sweeps/digits_grid.py", "--sigma", "0.03", "--lam", "0,1", "--seeds", "0", "--K", "2",
         "--batch-size", "256", "--mi-eval-steps", "20", "--device", "cpu",
         "--cpus-per-trial", "1", *SMALL_NET]
LEAD_S = 180  # A's early signal: `--signal=B:USR1@180`, and SWEEP_SIGNAL_LEAD for the script
END_S = 30  # a driver's last line to its job's end, at most
DRIVER_LAST_LINE = "TensorBoard: "  # what a finished sweep's driver prints last


def _until(check, what: str, timeout_s: float, logs: list[Path]) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            tails = "".join(f"\n--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                            for p in logs if p.exists())
            raise AssertionError(f"{what}: not after {timeout_s:.0f} s{tails}")
        time.sleep(0.2)


FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")


def ended_after_last_line(slurm: Slurm, jobs: dict[str, Path], timeout_s: float,
                          logs: list[Path], last_line: str = DRIVER_LAST_LINE
                          ) -> dict[str, float]:
    """Wait for `jobs` (job -> its log) to end; per job, the seconds from the first time
    `last_line` was seen in its log (polled every 0.2 s) to the job's end."""
    seen: dict[str, float] = {}
    ended: dict[str, float] = {}
    deadline = time.monotonic() + timeout_s
    while len(ended) < len(jobs):
        if time.monotonic() > deadline:
            _until(lambda: False, f"jobs {sorted(set(jobs) - set(ended))} end", 0, logs)
        for job, log in jobs.items():
            if job not in seen and log.exists() and last_line in log.read_text():
                seen[job] = time.monotonic()
            if job not in ended and slurm.job(job)["JobState"] in FINAL:
                ended[job] = time.monotonic()
        time.sleep(0.2)
    return {job: ended[job] - seen.get(job, ended[job]) for job in jobs}


def resume_line(log: Path) -> list[str]:
    """The sbatch arguments of the line a stopped job's log ends with, after its options."""
    found = re.findall(r"continue with: sbatch \[the same options\] (.+)", log.read_text())
    assert found, log.read_text()[-3000:]
    return shlex.split(found[-1])


def _checkpointed(out: Path) -> bool:
    return any(out.glob("tune/digits_grid/trials/*/checkpoint/*"))


def _addresses(log: Path) -> list[str]:
    return re.findall(r"ray_node: head on \S+, ports \S+, address (\S+)", log.read_text())


def _check_results(out: Path, epochs: int) -> pd.DataFrame:
    assert (out / "table.md").is_file()
    df = pd.read_parquet(out / "results.parquet")
    assert (df["status"] == "ok").all(), df
    per_trial = df.groupby("trial_id")["epoch"].apply(sorted)
    assert len(per_trial) == 2 and all(list(e) == list(range(1, epochs + 1))
                                       for e in per_trial), per_trial
    # Each row names the Slurm node its trial ran on (the host is the same), and both nodes
    # ran trials (a trial restarted by a resume may go on, or start again, on either).
    assert set(df["node"]) == set(NODES), df[["trial_id", "epoch", "node"]]
    return df


def test_two_sweeps_share_the_nodes_one_survives_its_walltime_the_other_a_stop(slurm,
                                                                               tmp_path):
    out_a, out_b = tmp_path / "a", tmp_path / "b"
    log_a, log_b, log_b2 = (tmp_path / f"{n}.log" for n in ("a", "b", "b2"))
    epochs_a, epochs_b = 80, 4
    started = time.monotonic()
    job_a = slurm.sbatch(log_a, "--time=10", f"--signal=B:USR1@{LEAD_S}", str(SCRIPT), *SWEEP,
                         "--epochs", str(epochs_a), "--out", str(out_a),
                         env={"SWEEP_SIGNAL_LEAD": str(LEAD_S)})
    job_b = slurm.sbatch(log_b, "--time=10", str(SCRIPT), *SWEEP, "--epochs", str(epochs_b),
                         "--out", str(out_b), "--overwrite")
    logs = [log_a, log_b, log_b2, slurm.home / "log" / "slurmctld.log"]
    _until(lambda: _checkpointed(out_a) and _checkpointed(out_b),
           "both sweeps have a checkpoint", 360, logs)
    # Both jobs run at once on both nodes, each with a Ray of its own (its own GCS port).
    for job in (job_a, job_b):
        info = slurm.job(job)
        assert info["JobState"] == "RUNNING" and info["NodeList"] == "n[1-2]", info
    (address_a,), (address_b,) = _addresses(log_a), _addresses(log_b)
    assert address_a != address_b

    # B: stopped by hand with the walltime's signal, 9 minutes before its walltime. A's
    # walltime is brought forward only once B has ended, so that A is sure to be running when
    # B's end is checked for leaving it alone (A's early signal could otherwise come first).
    slurm.run("scancel", "--batch", "--signal=USR1", job_b)
    _until(lambda: slurm.job(job_b)["JobState"] not in ("RUNNING", "COMPLETING"),
           "B ends after its signal", 180, logs)
    info = slurm.job(job_b)
    assert info["JobState"] == "FAILED" and info["ExitCode"] == "143:0", info  # the driver's
    assert info["Restarts"] == "0"
    assert "stopped by USR1; continue with" in log_b.read_text()
    again = resume_line(log_b)  # as printed: the flags, without --overwrite, with --resume
    assert again[0] == "slurm/sweep.sbatch" and again[-1] == "--resume", again
    assert "--overwrite" not in again and again[1:-1] == [*SWEEP, "--epochs", str(epochs_b),
                                                          "--out", str(out_b)], again
    info = slurm.job(job_a)
    assert info["JobState"] == "RUNNING" and info["Restarts"] == "0", info  # A's Ray untouched
    # A: its walltime brought forward to between 100 and 160 s from now, inside the 180-s
    # lead: the early signal is due already and comes at Slurm's next check (within 30 s),
    # which leaves A over a minute to stop and requeue. A's 80 epochs outlast that on a fast
    # machine: its first run stopped at epoch 31 here alone, 9 beside the unit tests.
    elapsed = time.monotonic() - started
    slurm.run("scontrol", "update", f"JobId={job_a}",
              f"TimeLimit={math.ceil((elapsed + 100) / 60)}")
    job_b2 = slurm.sbatch(log_b2, "--time=10", *again)

    # A is requeued; while it waits, its walltime is set back, for one more run, not several.
    _until(lambda: slurm.job(job_a)["Restarts"] == "1", "A requeued at its walltime", 240,
           logs)
    slurm.run("scontrol", "update", f"JobId={job_a}", "TimeLimit=10")
    # Each ends with its driver: a finished sweep's job within END_S of the driver's last line.
    after = ended_after_last_line(slurm, {job_a: log_a, job_b2: log_b2}, 420, logs)
    for job in (job_a, job_b2):
        info = slurm.job(job)
        assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", \
            (info, log_a.read_text()[-3000:], log_b2.read_text()[-3000:])
        assert after[job] <= END_S, (after, log_a.read_text()[-2000:])
    took = time.monotonic() - started

    text_a = log_a.read_text()
    assert "the walltime is" in text_a and "requeued" in text_a, text_a[-3000:]
    # Two heads: the requeued run started a Ray of its own rather than joining the old one.
    # Its address may repeat the first run's: that Ray ended with its job, freeing its port.
    assert len(_addresses(log_a)) == 2, text_a[-3000:]
    assert re.search(r"resume: \d+ of \d+ trials already finished", text_a)
    df_a = _check_results(out_a, epochs_a)
    assert (df_a["start_epoch"] > 1).any(), df_a[["trial_id", "epoch", "start_epoch"]]
    assert re.search(r"resume: \d+ of \d+ trials already finished", log_b2.read_text())
    df_b = _check_results(out_b, epochs_b)
    assert (df_b["start_epoch"] > 1).any(), df_b[["trial_id", "epoch", "start_epoch"]]
    # Each node's Ray stopped by pid and its directory removed; no process of any left.
    for job in (job_a, job_b, job_b2):
        assert not list(Path("/tmp").glob(f"ray_{job}_*")), job
        assert not with_text(f"/tmp/ray_{job}_"), job
    print(f"A, B and B's resume: {took:.0f} s; last line to the job's end: "
          f"A {after[job_a]:.0f} s, B's resume {after[job_b2]:.0f} s")
