"""A trial's worker keeps the raylet's SIGTERM quiet (trainables/tune_trial.py:
quiet_sigterm_in_worker): with Ray's own handler, one landing in the interpreter's teardown
or in a weakref callback printed a SystemExit traceback in the driver's output."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.system  # signals to a process

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
    from trainables.tune_trial import quiet_sigterm_in_worker
    quiet_sigterm_in_worker()
    quiet_sigterm_in_worker()  # once per process, however many trials the actor ran
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


# A worker mid-trial: Ray's own handler installed, the raylet's SIGTERM landing while a weakref
# callback runs (where an exception cannot propagate), then a callback with a real bug.
IN_A_CALLBACK = """
import os, signal, sys, time, weakref
sys.path.insert(0, {root!r})

def rays_handler(signum, frame):  # ray/_private/worker.py: main_loop's sigterm_handler
    raise SystemExit(1)

signal.signal(signal.SIGTERM, rays_handler)
if {quiet}:
    from trainables.tune_trial import quiet_sigterm_in_worker
    quiet_sigterm_in_worker()

class Tensor:
    pass

def collected(ref):
    os.kill(os.getpid(), signal.SIGTERM)
    deadline = time.time() + 5
    while time.time() < deadline:  # the handler runs here, between two bytecodes
        pass
    print("callback finished without the signal", flush=True)

def buggy(ref):
    raise ValueError("a bug in a callback")

a, b = Tensor(), Tensor()
refs = [weakref.ref(a, collected), weakref.ref(b, buggy)]
del a, b
print("the worker went on", flush=True)
"""


@pytest.mark.parametrize("quiet", [True, False])
def test_a_sigterm_in_a_weakref_callback_is_quiet_and_other_errors_are_not(quiet):
    proc = subprocess.run([sys.executable, "-c", IN_A_CALLBACK.format(root=str(ROOT), quiet=quiet)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "the worker went on" in proc.stdout
    assert "callback finished without the signal" not in proc.stdout  # it landed in there
    assert "ValueError: a bug in a callback" in proc.stderr  # other errors still reported
    if quiet:
        assert "SystemExit" not in proc.stderr, proc.stderr
    else:  # what the hook is for: Ray's SystemExit printed as an ignored exception
        assert "SystemExit" in proc.stderr and "Exception ignored" in proc.stderr
