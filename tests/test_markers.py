"""The `ray` marker (tests/conftest.py): what `make test-fast` (`-m "not ray"`) leaves out, and
the check that fails a test not marked `ray` that starts a Ray or a sweep driver anyway."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

CASES = '''
import os
import subprocess
import sys
from pathlib import Path

import pytest


def _launch():
    return subprocess.run([sys.executable, "sweeps/digits_grid.py", "--help"])


def test_plain():
    pass


def test_export_is_no_driver(tmp_path):
    # the export tool reads files only: not a driver (it fails here: no such file)
    subprocess.run([sys.executable, "sweeps/export_epochs.py", "--help"], cwd=tmp_path,
                   capture_output=True)


def test_unmarked_session():
    # what a Ray started by this test or a process it ran leaves in RAY_TMPDIR
    Path(os.environ["RAY_TMPDIR"], "ray", "session_2026_x").mkdir(parents=True)


def test_unmarked_driver():
    # spelt so that the collection hook cannot see it: the run-time check must catch it
    package = "sw" + "eeps"
    subprocess.run([sys.executable, "-m", package, "digits", "--help"], capture_output=True)


def test_uses_the_ray_fixture(ray_local):
    pass


def test_calls_a_helper_that_runs_a_driver():
    _launch()


@pytest.mark.ray
def test_marked_by_hand():
    pass
'''


def test_fast_run_leaves_ray_tests_out_and_fails_the_unmarked_ones(tmp_path):
    shutil.copy(TESTS / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_cases.py").write_text(CASES)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-m", "not ray",
                           "-p", "no:cacheprovider", "-o", "markers=ray: starts Ray",
                           str(tmp_path)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    out = proc.stdout
    # the session check fails the test at its teardown (an error), the driver check at once
    assert "1 failed, 3 passed, 3 deselected, 1 error" in out, out
    assert "FAILED test_cases.py::test_unmarked_driver" in out
    assert "ERROR test_cases.py::test_unmarked_session" in out
    assert "PASSED test_cases.py::test_plain" in out
    assert "PASSED test_cases.py::test_export_is_no_driver" in out
    assert "started Ray in a process it ran (session_2026_x) but is not marked `ray`" in out
    assert "runs a sweep driver" in out and "is not marked `ray`" in out


@pytest.mark.parametrize(("argv", "driver"), [
    ([sys.executable, "/repo/sweeps/digits_grid.py", "--help"], True),
    ([sys.executable, Path("sweeps") / "lambda_search.py"], True),
    ([sys.executable, "-m", "sweeps", "rerun", "OUT"], True),
    ([sys.executable, "-m", "sweeps"], True),
    ([sys.executable, "sweeps/export_epochs.py", "OUT", "CSV"], False),
    ([sys.executable, "-m", "sweeps", "export", "OUT", "CSV"], False),
    ([sys.executable, "-m", "analysis", "OUT"], False),
    ("echo sweeps", False),
])
def test_driver_command_lines(argv, driver):
    from tests.conftest import _driver_argv

    assert _driver_argv(argv) is driver
