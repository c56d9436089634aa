"""A sweep's OUT directory: its checks, and what a finished sweep writes there."""

from __future__ import annotations

import importlib.metadata
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from analysis.build import EXPERIMENT_FILE, build_all
from analysis.io import atomic_write_parquet, atomic_write_text
from sweeps.cli import SweepArgs
from sweeps.common import BUCKET_SCHEMES, SweepError


def check_out_dir(args: SweepArgs, experiment: str) -> None:
    """Refuse to mix experiments in one OUT, and fail before writing if it is not writable."""
    out = args.out
    marker = out / EXPERIMENT_FILE
    if out.exists() and not out.is_dir():
        raise SweepError(f"--out {out} exists and is not a directory")
    if marker.exists() and not (args.resume or args.overwrite):
        raise SweepError(f"--out {out} already holds results of an earlier sweep; pass "
                         f"--resume to continue it or --overwrite to replace it")
    if marker.exists() and args.resume:
        previous = json.loads(marker.read_text()).get("experiment")
        if previous != experiment:
            raise SweepError(f"--out {out} holds experiment {previous!r}, not {experiment!r}")
    probe = out if out.exists() else next((p for p in out.parents if p.exists()), Path("."))
    if not probe.is_dir():
        raise SweepError(f"--out {out} is not writable: {probe} is not a directory")
    # Try a write instead of os.access, which says yes to root on read-only file systems.
    try:
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as exc:
        raise SweepError(f"--out {out} is not writable: {exc.strerror or exc}") from None


# The storage check runs in a process of its own, killed at this limit: pyarrow retries an
# endpoint that never answers for minutes (GCS without credentials: over 150 s).
STORAGE_CHECK_S = 10.0

# The child's answer, one line: "ok", "missing ROOT" or "error REASON". os._exit after it: an
# S3 client's finalizer can wait on a request that never ends.
_STORAGE_PROBE = """
import os, sys
from pyarrow import fs
uri, bucket = sys.argv[1], sys.argv[2] == "1"
try:
    filesystem, path = fs.FileSystem.from_uri(uri)
    root = path.strip("/").split("/", 1)[0] if bucket else path
    info = filesystem.get_file_info(root)
    answer = f"missing {root}" if bucket and info.type == fs.FileType.NotFound else "ok"
except (OSError, ValueError) as exc:
    lines = str(exc).strip().splitlines()
    answer = "error " + (lines[0] if lines else type(exc).__name__)
print(answer, flush=True)
os._exit(0)
"""


def check_storage_reachable(args: SweepArgs, limit_s: float = STORAGE_CHECK_S) -> None:
    """A --storage-path URI's bucket (or root) exists and this machine reads it within
    `limit_s`, else a SweepError with pyarrow's cause, before Ray starts."""
    uri = args.storage_path
    if not uri or "://" not in uri:
        return
    bucket = uri.split("://", 1)[0] in BUCKET_SCHEMES
    try:
        ran = subprocess.run([sys.executable, "-c", _STORAGE_PROBE, uri, str(int(bucket))],
                             capture_output=True, text=True, timeout=limit_s)
        answer, stderr = ran.stdout.strip(), ran.stderr.strip()
    except subprocess.TimeoutExpired as exc:
        answer = (exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or "")
        answer, stderr = answer.strip(), ""
        if not answer:
            answer = (f"error no answer within {limit_s:g} s (the endpoint, the network or "
                      f"the credentials)")
    kind, _, detail = answer.partition(" ")
    if kind == "missing":
        raise SweepError(f"--storage-path {uri}: {detail} does not exist (create the bucket, "
                         f"or name one these credentials can write)")
    if kind != "ok":  # "error", or the check itself failed (its last line of stderr)
        reason = detail if kind == "error" else (stderr.splitlines() or ["no answer"])[-1]
        raise SweepError(f"--storage-path {uri}: cannot reach it: {reason}")


def copy_outputs_to_storage(args: SweepArgs, written: list[Path]) -> str | None:
    """The outputs copied to STORAGE/<name of OUT>/outputs/ with a --storage-path, so they
    outlive the machine that wrote them (a cluster's head goes with `ray down`)."""
    if not args.storage_path:
        return None
    from pyarrow import fs

    dest = storage_dir(args).rstrip("/") + "/outputs"
    if "://" in dest:
        filesystem, root = fs.FileSystem.from_uri(dest)
    else:
        filesystem, root = fs.LocalFileSystem(), str(Path(dest).resolve())
    out = args.out.resolve()
    for path in written:
        path = Path(path).resolve()
        rel = path.relative_to(out).as_posix() if path.is_relative_to(out) else path.name
        target = f"{root}/{rel}"
        filesystem.create_dir(target.rsplit("/", 1)[0], recursive=True)
        with filesystem.open_output_stream(target) as stream:
            stream.write(path.read_bytes())
    return dest


def storage_dir(args: SweepArgs) -> str:
    """Where this sweep's trial state lives: OUT/tune, or STORAGE/<name of OUT> (so sweeps
    of different OUT never share a directory there)."""
    if args.storage_path:
        return args.storage_path.rstrip("/") + "/" + args.out.resolve().name
    return str((args.out / "tune").resolve())


def provenance() -> dict[str, object]:
    """Package versions and the git commit ("unknown" where the code came without .git)."""
    versions = {"python": platform.python_version()}
    for dist in ("unbiased-mi", "torch", "torchvision", "ray", "pandas", "numpy", "pyarrow",
                 "optuna", "scikit-learn"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = "not installed"
    repo = Path(__file__).resolve().parents[1]

    def git(*cmd: str) -> str:
        try:
            return subprocess.run(["git", "-C", str(repo), *cmd], capture_output=True,
                                  text=True, timeout=10, check=True).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    commit = git("rev-parse", "HEAD") or "unknown"
    dirty = bool(git("status", "--porcelain", "--untracked-files=no")) if commit != "unknown" \
        else None
    return {"versions": versions, "git_commit": commit, "git_dirty": dirty,
            "command": " ".join(sys.argv)}


def write_outputs(args: SweepArgs, experiment: str, df: pd.DataFrame) -> list[Path]:
    path = args.out / "results.parquet"
    record = {"experiment": experiment, "benchmark": args.benchmark, "preset": args.preset,
              "values": args.values, "written": time.strftime("%Y-%m-%dT%H:%M:%S"),
              **args.extra, **provenance()}
    meta = {"unbiased.experiment": json.dumps(record, default=str, sort_keys=True)}
    atomic_write_parquet(df, path, metadata=meta)
    atomic_write_text(args.out / EXPERIMENT_FILE, json.dumps(record, indent=2, default=str))
    written = [path, args.out / EXPERIMENT_FILE]
    written += [Path(p) for p in build_all(args.out)]
    return written
