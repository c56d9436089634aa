"""What the sweep modules share, importing none of them: the user-facing error and checks."""

from __future__ import annotations

import os
import sys


class SweepError(Exception):
    """A sweep cannot start or finish; the message is one line for the user."""


def fail(message: str) -> None:
    """A driver's end on a SweepError: its one line on stderr, exit status 2."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


# The storage URI schemes Tune writes to through pyarrow, and those that name a bucket.
STORAGE_SCHEMES = ("s3", "gs", "gcs", "hdfs", "file")
BUCKET_SCHEMES = ("s3", "gs", "gcs")

# Set by Ray's job supervisor for a `ray job submit` entrypoint (with RAY_ADDRESS, the GCS).
RAY_JOB_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"


def ray_job_address() -> str | None:
    """The cluster a sweep started by `ray job submit` runs on; None outside a Ray job."""
    if os.environ.get(RAY_JOB_ENV) and os.environ.get("RAY_ADDRESS"):
        return os.environ["RAY_ADDRESS"]
    return None


def storage_uri_problem(path: str) -> str | None:
    """What is wrong with a --storage-path URI's form (None: nothing, or not a URI)."""
    if "://" not in path:
        return None
    scheme, rest = path.split("://", 1)
    if scheme not in STORAGE_SCHEMES:
        return f"{scheme}:// is not a storage Tune writes to ({', '.join(STORAGE_SCHEMES)})"
    if scheme in BUCKET_SCHEMES and not rest.split("/", 1)[0]:
        return f"no bucket after {scheme}:// (e.g. {scheme}://my-bucket/unbiased-mi)"
    return None
