"""A real local S3 API for the tests that keep Tune's state in a bucket: moto's server mode
(a dev dependency), reached through the standard AWS_ENDPOINT_URL, as pyarrow (and so Tune
and the drivers' storage checks) read it. Its request log shows what was read and written."""

from __future__ import annotations

import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

from tests.processes import free_port, stop_group

BUCKET = "unbiased-test"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # the server colours some status lines


@dataclass
class S3:
    env: dict[str, str]  # what a process needs to use the server (set for drivers and nodes)
    log: Path  # one line per request: "GET /bucket/key HTTP/1.1" 200

    def filesystem(self):
        from pyarrow import fs

        return fs.S3FileSystem(endpoint_override=self.env["AWS_ENDPOINT_URL"],
                               access_key="testing", secret_key="testing", region="us-east-1")

    def keys(self, prefix: str) -> list[str]:
        """Every object under BUCKET/prefix, as bucket-relative paths."""
        from pyarrow import fs

        infos = self.filesystem().get_file_info(fs.FileSelector(f"{BUCKET}/{prefix}",
                                                                recursive=True,
                                                                allow_not_found=True))
        return sorted(i.path.split("/", 1)[1] for i in infos if i.type == fs.FileType.File)

    def checkpointed_epochs(self, experiment: str) -> dict[str, int]:
        """The epoch of each trial's latest checkpoint under BUCKET/experiment, by the trial's
        record (trainables/record.py: trials/<key>/checkpoint/<epoch>/). A trial writes its
        checkpoint there before it reports the epoch: polled here, it is seen without the lag
        of a driver's output."""
        latest: dict[str, int] = {}
        for key in self.keys(experiment):
            match = re.search(r"/trials/([^/]+)/checkpoint/(\d+)/", key)
            if match:
                trial, epoch = match.group(1), int(match.group(2))
                latest[trial] = max(latest.get(trial, 0), epoch)
        return latest

    def requests(self, method: str, needle: str) -> list[str]:
        """Request lines of `method` on the bucket whose (unquoted) path holds `needle`."""
        lines = [unquote(_ANSI.sub("", line))
                 for line in self.log.read_text(errors="replace").splitlines()]
        return [line for line in lines
                if f'"{method} /{BUCKET}' in line and needle in line.split(" HTTP/")[0]]


@contextmanager
def s3_server(where: Path) -> Iterator[S3]:
    """moto_server on a free local port with the bucket BUCKET made, until the block ends."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = where / "s3_requests.log"
    with log.open("w") as out:
        server = subprocess.Popen([str(Path(sys.executable).with_name("moto_server")), "-H",
                                   "127.0.0.1", "-p", str(port)], stdout=out,
                                  stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + 60
        while True:
            try:
                request = urllib.request.Request(f"{url}/{BUCKET}", method="PUT")
                with urllib.request.urlopen(request, timeout=2):
                    break
            except OSError:
                assert server.poll() is None, log.read_text()[-2000:]
                assert time.time() < deadline, "moto_server did not answer in 60 s"
                time.sleep(0.5)
        yield S3({"AWS_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": "testing",
                  "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                  "AWS_EC2_METADATA_DISABLED": "true"}, log)
    finally:
        stop_group(server, grace_s=20)
