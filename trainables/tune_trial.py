"""The Ray Tune side of a trial: the one function trainable of every registered benchmark
(`trainable_for`) and the session it gives the trial loop (`TuneSession`). The loop itself is
unbiased/trial.py, which never imports Ray.

A trial trains on `SPEC.build(config, **loaded)` of its benchmark (unbiased.benchmarks), where
`loaded` is what the driver's `SPEC.load` read once and `tune.with_parameters` put in the
object store (`tune.with_parameters(trainable_for("digits"), digits=grey_digits)`); without it
a build reads its own data. A trial of several grid points (`--bundle`) is `run_bundle`'s.
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable
from typing import Any

from trainables.record import RESTORED, RecordStore, StoreSession, reported
from unbiased.benchmarks import benchmark_spec
from unbiased.settings import RECORDS_KEY, flat_config
from unbiased.trial import MEMBERS_KEY, machine_id, run_bundle, run_trial


def trainable_for(name: str) -> Callable[..., None]:
    """The trainable of one benchmark, named `train_<name>`: Tune names a sweep's trials after
    its trainable, and a sweep keeps the names it had (a --resume of a sweep started before
    finds its trials). Config keys: benchmark; method and its config fields
    (unbiased/methods), seed, epochs, device, num_threads, mi_eval_steps, select_epoch
    (unbiased/trial.py); the benchmark's data axes and build keys (its SPEC);
    fail_once_at_epoch (tests only)."""
    spec = benchmark_spec(name)

    def train(config: dict, **loaded: object) -> None:
        run = run_bundle if MEMBERS_KEY in flat_config(config) else run_trial
        run(config, lambda cfg: spec.build(cfg, **loaded), tune_session(config))

    train.__name__ = train.__qualname__ = f"train_{name}"
    return train


def tune_session(config: dict) -> TuneSession:
    """The session of a trial in a Ray worker, the worker's logging and SIGTERM quietened."""
    # Tune logs every checkpoint at INFO from the worker; the driver prints progress.
    logging.getLogger("ray.train").setLevel(logging.WARNING)
    logging.getLogger("ray.tune").setLevel(logging.WARNING)
    quiet_sigterm_in_worker()
    return TuneSession(config)


class TuneSession(StoreSession):
    """The session of a Ray Tune function trainable: a StoreSession over the records in the
    sweep's storage, which every launch and every restart reads, that also gives Tune each
    report, without a checkpoint (its scheduler, progress, trackers and searchers read the
    metrics). `config`: the trial's config as Tune gave it; made in the trial's worker."""

    def __init__(self, config: dict) -> None:
        from ray import tune

        if RECORDS_KEY not in config:
            raise ValueError(f"a Tune trial's config names where its record lives "
                             f"({RECORDS_KEY!r}, trainables/record.py: records_root); the "
                             f"sweep's Tuner sets it (sweeps/runner.py)")
        super().__init__(RecordStore.located(str(config[RECORDS_KEY])), config,
                         tune.get_context().get_trial_id())

    def restore(self) -> dict[str, bytes] | None:
        """The record's checkpoint; its rows told to Tune again first (marked RESTORED: the
        driver prints none of them, the trackers log those they lack, the scheduler sees the
        trial's whole history)."""
        from ray import tune

        for row in self.rows:
            tune.report({**reported(row), RESTORED: True})
        return self.restored

    def report(self, metrics: dict, checkpoint: dict[str, bytes] | None = None) -> None:
        from ray import tune

        super().report(metrics, checkpoint)
        tune.report(metrics)

    def where(self) -> dict[str, str]:
        # Hostnames repeat across Ray nodes on one machine (and in some clusters); node ids not.
        # Under Slurm (slurm/sweep.sbatch), the node Slurm named: the Ray node started there
        # passes SLURMD_NODENAME on to its workers.
        import ray

        return {"node": os.environ.get("SLURMD_NODENAME") or socket.gethostname(),
                "node_id": ray.get_runtime_context().get_node_id(), "machine": machine_id()}

    def gpu_ids(self) -> list:
        import ray

        try:
            return list(ray.get_gpu_ids()) if ray.is_initialized() else []
        except Exception:  # noqa: BLE001 - outside a worker Ray may refuse; then there are none
            return []


@functools.cache  # once per worker process, however many trials its actor runs
def quiet_sigterm_in_worker() -> None:
    """Keep the raylet's SIGTERM out of the driver's output. The raylet SIGTERMs an actor's
    worker as soon as it disconnects (a finished or stopped trial) and SIGKILLs it 200 ms
    later; Ray's handler raises SystemExit wherever the main thread is. Inside a weakref
    callback or a __del__ that exception cannot propagate, and Python printed its traceback
    ("Exception ignored in ... SystemExit: 1"), which reached the driver after trials ended
    and on a stopped sweep. The worker is ending anyway: the SIGKILL
    still comes.
    - Once the interpreter exits, SIGTERM is ignored: atexit runs this handler in the main
      thread (where signal.signal is allowed) before the teardown of modules and weak
      references, and before Ray's own atexit shutdown (registered earlier, run later).
    - Before that, an unraisable SystemExit is dropped silently; every other unraisable
      exception still goes to the hook that was there."""
    atexit.register(signal.signal, signal.SIGTERM, signal.SIG_IGN)
    sys.unraisablehook = _drop_unraisable_system_exit(sys.unraisablehook)


def _drop_unraisable_system_exit(previous: Callable[[Any], object]) -> Callable[[Any], None]:
    def hook(unraisable: Any) -> None:
        if not isinstance(unraisable.exc_value, SystemExit):
            previous(unraisable)
    return hook
