"""A driver ends within seconds of its last line, after a finish or a stop, and tells the
batch script how far the sweep got. Why a driver joined to a Ray it did not start could
outlive its work (after a plain `scancel` Tune and `ray.shutdown()` retry the lost GCS for
60 s, longer than Slurm's KillWait; threads or Ray's native teardown can hold the interpreter
after the outputs are written): docs/DESIGN.md. `StopWatch` and `end_driver` end it.

`SWEEP_PROGRESS_FILE` (set by the batch script) gets, on every result, the trials done and
the epochs this run trained, so the script never requeues a finished sweep and stops
requeueing one that makes no progress.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import NoReturn

PROGRESS_ENV = "SWEEP_PROGRESS_FILE"
EXIT_GRACE_S = 15.0  # ray.shutdown() after the last line, at most
STOP_GRACE_S = 20.0  # a stop signal to the driver's exit, at most (Slurm's KillWait: 30 s)
GCS_GONE_S = 2.0  # the GCS unreachable this long after a stop: Ray cannot clean up


def gcs_address() -> str | None:
    """HOST:PORT of the GCS this driver is connected to, if any."""
    import ray

    if not ray.is_initialized():
        return None
    return ray.get_runtime_context().gcs_address


def reachable(address: str, timeout_s: float = 1.0) -> bool:
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except (OSError, ValueError):
        return False
    return True


def _waiting_on() -> str:
    """What holds the process: its threads other than this one, and where the main thread is."""
    main = threading.main_thread()
    frame = sys._current_frames().get(main.ident or -1)
    where = (f"main thread in {frame.f_code.co_name} ({os.path.basename(frame.f_code.co_filename)}"
             f":{frame.f_lineno})" if frame is not None else "main thread finished")
    others = sorted(t.name for t in threading.enumerate()
                    if t is not main and t is not threading.current_thread() and t.is_alive()
                    and not t.daemon)
    return where + (f"; threads {', '.join(others)}" if others else "")


def _end(status: int, line: str) -> None:
    print(line, file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(status)


def end_driver(main: Callable[[], int | None]) -> NoReturn:
    """A driver script's end with `main()`'s status: one that started or joined Ray leaves it
    (EXIT_GRACE_S at most) and ends the process without the interpreter's own end (a job was
    seen RUNNING 240 s after its last line, until Slurm's TERM)."""
    try:
        status = main()
    except SystemExit as exc:
        status = exc.code
    if status is None:
        status = 0
    elif not isinstance(status, int):
        print(status, file=sys.stderr, flush=True)
        status = 1
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        sys.exit(status)
    leaving = threading.Thread(target=ray.shutdown, name="ray-shutdown", daemon=True)
    leaving.start()
    leaving.join(EXIT_GRACE_S)
    if leaving.is_alive():
        print(f"Ray had not let the driver go {EXIT_GRACE_S:.0f} s after its last line "
              f"({_waiting_on()}): exiting with status {status}", file=sys.stderr, flush=True)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


class StopWatch:
    """After a stop signal, end the driver (128 + the signal, `message(signum)`) once Ray's
    GCS has been unreachable for GCS_GONE_S, or STOP_GRACE_S after the signal: Tune saved its
    state on hearing the signal, so the sweep can resume.

    It hears the signal through Python's wakeup fd: a Python handler runs only once the main
    thread is back in Python, and one blocked in a call to a dead GCS never is (seen under
    `scancel`). `release()` gives the wakeup fd back; `disarm()` also stops the countdown."""

    def __init__(self, address: str | None, message: Callable[[int], str],
                 signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)) -> None:
        self.address, self.message, self.signals = address, message, signals
        self.signum: int | None = None
        self.disarmed = threading.Event()
        self._reader, self._writer = socket.socketpair()
        self._writer.setblocking(False)
        self._before = signal.set_wakeup_fd(self._writer.fileno(), warn_on_full_buffer=False)
        threading.Thread(target=self._hear, name="stop-watch", daemon=True).start()

    def release(self) -> None:
        if self._writer.fileno() >= 0:
            signal.set_wakeup_fd(self._before)
            self._writer.close()  # the listening thread reads its end and returns

    def disarm(self) -> None:
        self.disarmed.set()
        self.release()

    def _hear(self) -> None:
        """Read the wakeup fd until it is released (closed earlier, Python would complain at
        every later signal)."""
        with self._reader:
            while True:
                try:
                    data = self._reader.recv(64)
                except OSError:
                    return
                if not data:
                    return
                heard = [b for b in data if b in self.signals]
                if heard and self.signum is None:
                    self.signum = heard[0]
                    threading.Thread(target=self._count_down, args=(self.signum,),
                                     name="stop-countdown", daemon=True).start()

    def _count_down(self, signum: int) -> None:
        started = time.monotonic()
        gone_since: float | None = None
        while (elapsed := time.monotonic() - started) < STOP_GRACE_S:
            if self.disarmed.wait(0.5):
                return
            if self.address is not None and not reachable(self.address):
                gone_since = gone_since if gone_since is not None else time.monotonic()
                if time.monotonic() - gone_since >= GCS_GONE_S:
                    _end(128 + signum, f"Ray's GCS at {self.address} is gone (stopped with "
                                       f"the job): not waiting for Ray to clean up. "
                                       + self.message(signum))
            else:
                gone_since = None
        if not self.disarmed.is_set():
            _end(128 + signum, f"Ray had not let go of the trials {elapsed:.0f} s after the "
                               f"signal ({_waiting_on()}): ending the driver. "
                               + self.message(signum))


_PROGRESS: dict[str, tuple[int, int]] = {}  # experiment -> trials, finished
_NEW_EPOCHS = [0]  # epochs trained by this driver (restored ones, told again, not counted)


def write_progress(experiment: str, trials: int, finished: int, new_epochs: int = 0) -> None:
    """SWEEP_PROGRESS_FILE (module docstring), written whole on every result."""
    _NEW_EPOCHS[0] += new_epochs
    path = os.environ.get(PROGRESS_ENV)
    if not path:
        return
    _PROGRESS[experiment] = (trials, finished)
    totals = [sum(column) for column in zip(*_PROGRESS.values(), strict=True)]
    tmp = f"{path}.part"
    with open(tmp, "w") as out:
        json.dump({"trials": totals[0], "finished": totals[1], "new_epochs": _NEW_EPOCHS[0]},
                  out)
    os.replace(tmp, path)
