"""Shared fixtures: one real local Ray per test session, small real data; the `ray` marker.

A test that starts Ray, in the test or in a process it runs, or that runs a sweep driver
(a Python start importing torch and Ray: seconds each, tens of them on a loaded machine) is
marked `ray` in its own file (`@pytest.mark.ray`, or `pytestmark` for a whole file), and `make
test-fast` (`pytest -m "not ray and not system"`) leaves it out; so are `system` and `slow`
(over ~4 s idle).

`_no_ray_unless_marked` fails a test not marked `ray` that does either anyway: it runs with
RAY_TMPDIR set to a directory of its own, which the processes it starts inherit (a Ray session
directory there afterwards, or a Ray this process had not started before, means a Ray was
started), and a driver started through `subprocess` fails it at once.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")


# A small LeNet for the tests that run real trials only to check the machinery (reports,
# checkpoints, resume, stops, trackers, tables), never how well the network learns: 8
# channels in place of the paper's 64, and train_acc / mi / mi_eval measured on 500 training
# rows instead of every one. On the quick preset's 4,000 digits it cut an epoch from ~6 s of
# training + ~5 s of evaluation to ~2 s + ~0.3 s (2 cores). Not for a test whose assertion
# needs the network to learn (an accuracy level, mi falling as lambda grows).
SMALL_NET = ["--width", "8", "--train-eval-rows", "500"]  # a driver's flags
SMALL_NET_CONFIG = {"width": 8, "train_eval_rows": 500}  # a trial's config, the same
# Trials one at a time on a 2-CPU Ray, each with one torch thread (a trial's threads are its
# whole CPUs): they all run in one worker process, which Tune reuses. Side by side, each
# would start a process of its own (importing torch and Tune: ~7 s of CPU); on 2 CPUs each,
# two threads would contend with the other test worker's (docs/MEASURED.md, "The test
# suite's time").
ONE_AT_A_TIME = ["--cpus-per-trial", "1.5"]


def pytest_configure(config: pytest.Config) -> None:
    # Under `make test` two workers share the cores. torch's default (a thread per core
    # each) makes the workers' OpenMP threads spin against each other: one MINE training
    # test took 143 s with 2 threads beside a busy core, 9 s with 1 (docs/MEASURED.md, "The
    # test suite's time"). A trial sets its own threads (its config's num_threads).
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers > 0:
        import torch

        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Files with a system test first, then those with a Ray or a slow test, each file's tests
    # in their order: `make test` hands whole files to two workers in this order (--dist
    # loadfile --no-loadscope-reorder), so the minutes-long files start early and the short
    # unit files even out the end (docs/MEASURED.md, "Toward CI in 12 minutes").
    tier: dict[str, int] = {}
    for item in items:
        rank = (0 if item.get_closest_marker("system") else
                1 if item.get_closest_marker("ray") or item.get_closest_marker("slow") else 2)
        tier[item.location[0]] = min(rank, tier.get(item.location[0], 2))
    items.sort(key=lambda item: tier[item.location[0]])  # stable: files keep their order


def _ray_running_here() -> bool:
    ray = sys.modules.get("ray")
    return ray is not None and hasattr(ray, "is_initialized") and ray.is_initialized()


def _driver_argv(args) -> bool:
    """Whether a subprocess command line runs a sweep driver."""
    argv = [os.fspath(a) for a in args] if isinstance(args, (list, tuple)) else [str(args)]
    if any(re.search(r"(^|/)sweeps/(?!export_epochs\.py$)\w+\.py$", a) for a in argv):
        return True
    return any(a == "-m" and b == "sweeps" and c != "export"
               for a, b, c in zip(argv, argv[1:], [*argv[2:], ""], strict=False))


_MARK_IT = "add @pytest.mark.ray so that `make test-fast` leaves it out"


@pytest.fixture(autouse=True)
def _no_ray_unless_marked(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):
    """Fail a test not marked `ray` that starts a Ray or a sweep driver."""
    if request.node.get_closest_marker("ray") is not None:
        yield
        return
    popen_init = subprocess.Popen.__init__

    def checked_init(self, args, *rest, **kwargs):
        if _driver_argv(args):
            pytest.fail(f"this test runs a sweep driver ({args}) but is not marked `ray`: "
                        f"{_MARK_IT}", pytrace=False)
        popen_init(self, args, *rest, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "__init__", checked_init)
    # Short: a Ray started here anyway must still fit its socket paths (107 characters).
    temp = Path(tempfile.mkdtemp(prefix="noray"))
    monkeypatch.setenv("RAY_TMPDIR", str(temp))
    before = _ray_running_here()
    try:
        yield
    finally:
        sessions = sorted(p.name for p in temp.glob("ray/session_*"))
        started_here = _ray_running_here() and not before
        shutil.rmtree(temp, ignore_errors=True)
    if sessions or started_here:
        where = f"in a process it ran ({sessions[0]})" if sessions else "in this process"
        pytest.fail(f"this test started Ray {where} but is not marked `ray`: {_MARK_IT}",
                    pytrace=False)


@pytest.fixture(scope="session")
def checked_at_the_end():
    """`add(what, done, deadline)`: a check whose answer comes by itself, late (a process
    that ends on its own within a minute), made once the session's other tests have run,
    not waited for in the test. Fails the session (an error at teardown) if `done()` is
    still false at `deadline` (time.time())."""
    pending: list[tuple[str, Callable[[], bool], float]] = []
    yield lambda what, done, deadline: pending.append((what, done, deadline))
    late = []
    for what, done, deadline in pending:
        while not done() and time.time() < deadline:
            time.sleep(0.5)
        if not done():
            late.append(what)
    assert not late, late


@pytest.fixture(scope="session")
def ray_local():
    import ray

    # address="local": a fresh instance even when a `ray start` cluster runs on this machine
    # (tests/test_multinode.py, other sessions), never one found through ray_current_cluster.
    from sweeps import ray_private

    ray_private.no_prestarted_workers()  # as a sweep's local Ray (sweeps/ray_init.py)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def grey_digits():
    from unbiased.benchmarks.digits.data import load_mnist5k

    return load_mnist5k()


@pytest.fixture(scope="session")
def tiny_digits(grey_digits):
    """200 train / 100 test real digits: enough for a trial to run in seconds."""
    from unbiased.benchmarks.digits.data import GreyDigits

    d = grey_digits
    tr = list(range(0, len(d.train_y), 20))
    te = list(range(0, len(d.test_y), 10))
    return GreyDigits(d.train_x[tr], d.train_y[tr], d.test_x[te], d.test_y[te], "mnist5k")
