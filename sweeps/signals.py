"""A sweep stopped by SIGTERM or SIGINT: Tune stops the trials (each keeps its finished
epochs in its record), the driver takes its Ray down and says how to resume."""

from __future__ import annotations

import logging
import os
import shlex
import signal
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from sweeps.ending import StopWatch, gcs_address

if TYPE_CHECKING:
    from sweeps.cli import SweepArgs


class QuietUnstarted(logging.Filter):
    """While `when()`, drop Tune's warning for each trial without results yet (100+ lines
    for a stopped Table 1 grid, above our own line on how to continue)."""

    LOGGER = "ray.tune.analysis.experiment_analysis"
    MESSAGE = "Failed to fetch metrics"

    def __init__(self, when: Callable[[], bool] = lambda: True) -> None:
        super().__init__()
        self.when = when

    def filter(self, record: logging.LogRecord) -> bool:
        return not (self.when() and self.MESSAGE in record.getMessage())

    def __enter__(self) -> QuietUnstarted:
        logging.getLogger(self.LOGGER).addFilter(self)
        return self

    def __exit__(self, *exc: object) -> None:
        logging.getLogger(self.LOGGER).removeFilter(self)


STOP = threading.Event()  # a stop signal came: `stopper()` ends Tune's run


def stopper():
    """Tune's stopper (its public way to end a run from outside): once STOP is set."""
    from ray import tune

    class StopOnSignal(tune.Stopper):
        def __call__(self, trial_id: str, result: dict) -> bool:
            return False

        def stop_all(self) -> bool:
            import sweeps.signals  # by name: Tune pickles its stopper with the run's config

            return sweeps.signals.STOP.is_set()

    return StopOnSignal()


# A stop signal that came outside a Tune run (`defer_stop_signals`).
PENDING: list[int] = []


def defer_stop_signals() -> None:
    """Outside Tune's runs (StopSignals covers those), keep a SIGTERM or SIGINT instead of
    dying where the driver stands: outputs being written are finished, and the next Tune run
    does not start but ends as a stop during a run does. A second signal stops at once."""
    if threading.current_thread() is not threading.main_thread():
        return
    PENDING.clear()

    def keep(signum: int, frame: object) -> None:
        name = signal.Signals(signum).name
        if PENDING:
            print(f"{name} received again: stopping now", file=sys.stderr, flush=True)
            raise SystemExit(128 + signum)
        PENDING.append(signum)
        print(f"{name} received: stopping before the next trials start (send it again to "
              f"stop at once)", file=sys.stderr, flush=True)

    for sig in StopSignals.SIGNALS:
        signal.signal(sig, keep)


class StopSignals:
    """SIGTERM or SIGINT during a Tune run: Tune stops the trials, then the driver shuts down
    its Ray (else its trial workers went on training) and says how to resume. A second signal
    stops at once; a StopWatch ends the driver should Ray hold it."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, args: SweepArgs) -> None:
        self.args = args
        self.received: int | None = None
        self._before: dict[int, object] = {}
        self._quiet = QuietUnstarted(lambda: self.received is not None)

    def __enter__(self) -> StopSignals:
        # Tune's own SIGINT handler would hide a Ctrl-C from us; one path for both signals.
        self._env = os.environ.get("TUNE_DISABLE_SIGINT_HANDLER")
        os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
        STOP.clear()
        for sig in self.SIGNALS:
            self._before[sig] = signal.signal(sig, self._handle)
        if PENDING:  # it came before this run: the run does not start
            self.received = PENDING[0]
            STOP.set()
        self._quiet.__enter__()
        self.watch = StopWatch(gcs_address(), self.stopped_line, self.SIGNALS)
        return self

    def __exit__(self, *exc: object) -> None:
        self.watch.release()
        self._quiet.__exit__()
        for sig, handler in self._before.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        if self._env is None:
            os.environ.pop("TUNE_DISABLE_SIGINT_HANDLER", None)
        else:
            os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = self._env

    def _handle(self, signum: int, frame: object) -> None:
        if self.received is not None:  # a second signal: stop now
            raise KeyboardInterrupt
        self.received = signum
        print(f"{signal.Signals(signum).name} received: stopping the trials (their finished "
              f"epochs are kept; send it again to stop at once)", file=sys.stderr, flush=True)
        STOP.set()  # Tune ends the run at its next step

    def stopped_line(self, signum: int | None = None) -> str:
        name = signal.Signals(signum or self.received or signal.SIGTERM).name
        return (f"stopped by {name}; the finished epochs are saved in {self.args.out}. "
                f"Continue with: python {resume_command(sys.argv)}")

    def exit(self) -> None:
        import ray

        ray.shutdown()  # the trial workers and, for a local Ray, the Ray this driver started
        print(self.stopped_line(), file=sys.stderr, flush=True)
        raise SystemExit(128 + int(self.received))


# Flags a --resume refuses: --done starts a new run, --overwrite discards what it continues.
_NOT_WITH_RESUME = {"--done": True, "--overwrite": False}  # flag -> takes a value


def resume_command(argv: list[str]) -> str:
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in _NOT_WITH_RESUME:
            skip = _NOT_WITH_RESUME[name] and "=" not in arg
            continue
        out.append(arg)
    if "--resume" not in out:
        out.append("--resume")
    return " ".join(shlex.quote(a) for a in out)
