"""A sweep driver's `main` called in the test's own process: for the checks that end before
any Ray or trial starts (bad flags, `--help`, `--dry-run`, refused OUT or data), and, in a
test with the `ray_local` fixture, for a sweep run on the session's Ray.

A driver started as a process spends ~5 s importing torch, pandas and matplotlib before it
reads a flag; ~50 such checks took a fifth of the suite. In this process those imports
are done once. What a process adds (the exit status the shell sees, a stray warning or log
line on stderr) is checked by one command-line test per contract (test_digits_grid.py's
`test_a_bad_flag_from_the_shell_is_one_line_and_exit_2`, test_flags.py's `-m sweeps` one).
A check that starts Ray here anyway fails: such a test is not marked `ray`
(tests/conftest.py: `_no_ray_unless_marked`)."""

from __future__ import annotations

import importlib
import io
import signal
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass


@dataclass
class Ran:
    """What `subprocess.run(..., capture_output=True, text=True)` gives, for a call."""

    returncode: int
    stdout: str
    stderr: str


def run_main(module: str, *argv: str) -> Ran:
    """`python -m sweeps.MODULE ARGV...` in this process: its exit status and output. An
    exception other than SystemExit propagates (a traceback: the test fails)."""
    main = importlib.import_module(f"sweeps.{module}").main
    out, err = io.StringIO(), io.StringIO()
    # A driver keeps a stop signal for later from its start (sweeps/signals.py): the test
    # process gets its own handlers back.
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as exc:
            code = exc.code
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
    if code is None:
        code = 0
    elif not isinstance(code, int):  # SystemExit("message"): printed, status 1
        err.write(f"{code}\n")
        code = 1
    return Ran(code, out.getvalue(), err.getvalue())


def run_sweep(name: str, *argv: str) -> Ran:
    """`python -m sweeps NAME ARGV...` in this process (a registered benchmark's grid)."""
    return run_main("__main__", name, *argv)
