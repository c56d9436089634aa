"""A trial's worker ignores the SIGTERM the raylet sends while it exits (trainables/common.py:
ignore_sigterm_at_exit): with Ray's own handler, one landing in the interpreter's teardown
printed a SystemExit traceback in the driver's output after trials ended (CI, stop 45)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# A worker as the raylet ends it: Ray's handler (raise SystemExit) installed, the trial's
# setup run (or not), then, while the interpreter exits, a SIGTERM to itself.
WORKER = """
import atexit, os, signal, sys, time
sys.path.insert(0, {root!r})

def rays_handler(signum, frame):  # ray/_private/worker.py: sigterm_handler
    raise SystemExit(1)

def raylet_sigterm():  # registered first: runs last, as the raylet's signal comes late
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.2)
    print("teardown went on", flush=True)

signal.signal(signal.SIGTERM, rays_handler)
atexit.register(raylet_sigterm)
if {ignore}:
    from trainables.common import ignore_sigterm_at_exit
    ignore_sigterm_at_exit()
    ignore_sigterm_at_exit()  # once per process, however many trials the actor ran
sys.exit(0)
"""


@pytest.mark.parametrize("ignore", [True, False])
def test_a_sigterm_while_the_worker_exits_is_quiet(ignore):
    proc = subprocess.run([sys.executable, "-c", WORKER.format(root=str(ROOT), ignore=ignore)],
                          capture_output=True, text=True, timeout=120)
    if ignore:
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
        assert "teardown went on" in proc.stdout
    else:  # what the fix is for: Ray's handler raising inside the exit
        assert "SystemExit" in proc.stderr and "teardown went on" not in proc.stdout
