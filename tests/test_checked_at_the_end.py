"""`checked_at_the_end` (tests/conftest.py): a late check fails the session when its answer
has not come by its deadline, and passes when it has."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

CASES = '''
import time


def test_leaves_a_late_check(checked_at_the_end):
    start = time.time()
    checked_at_the_end("comes in time", lambda: time.time() > start + 0.5, start + 30)
    checked_at_the_end("never comes", lambda: False, start + 1)


def test_another_test_runs_meanwhile():
    pass
'''


def test_a_late_check_that_never_comes_fails_the_session(tmp_path):
    shutil.copy(TESTS / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_cases.py").write_text(CASES)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(tmp_path)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1, proc.stdout[-2000:]
    assert "2 passed, 1 error" in proc.stdout, proc.stdout[-2000:]
    assert "never comes" in proc.stdout and "comes in time'" not in proc.stdout
