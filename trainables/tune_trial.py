"""The Ray Tune side of a trial: the function trainable of every registered benchmark and the
session it gives the trial loop (unbiased/trial.py, which never imports Ray).

A trial trains on `SPEC.build(config, **loaded)`, `loaded` being what the driver read once and
`tune.with_parameters` put in the object store; without it a build reads its own data.
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
    its trainable, and a --resume of a sweep started before finds its trials by them."""
    spec = benchmark_spec(name)

    def train(config: dict, **loaded: object) -> None:
        # Tune logs every checkpoint at INFO from the worker; the driver prints progress.
        logging.getLogger("ray.train").setLevel(logging.WARNING)
        logging.getLogger("ray.tune").setLevel(logging.WARNING)
        quiet_sigterm_in_worker()
        run = run_bundle if MEMBERS_KEY in flat_config(config) else run_trial
        run(config, lambda cfg: spec.build(cfg, **loaded), TuneSession(config))

    train.__name__ = train.__qualname__ = f"train_{name}"
    return train


class TuneSession(StoreSession):
    """A StoreSession that also gives Tune each report, without a checkpoint (its scheduler,
    progress, trackers and searchers read the metrics)."""

    def __init__(self, config: dict) -> None:
        from ray import tune

        if RECORDS_KEY not in config:
            raise ValueError(f"a Tune trial's config names where its record lives "
                             f"({RECORDS_KEY!r}, trainables/record.py: records_root); the "
                             f"sweep's Tuner sets it (sweeps/runner.py)")
        super().__init__(RecordStore.located(str(config[RECORDS_KEY])), config,
                         tune.get_context().get_trial_id())

    def restore(self) -> dict[str, bytes] | None:
        """The record's checkpoint, its rows told to Tune again first (marked RESTORED) so
        the trackers log those they lack and the scheduler sees the whole history."""
        from ray import tune

        for row in self.rows:
            tune.report({**reported(row), RESTORED: True})
        return self.restored

    def report(self, metrics: dict, checkpoint: dict[str, bytes] | None = None) -> None:
        from ray import tune

        super().report(metrics, checkpoint)
        tune.report(metrics)

    def where(self) -> dict[str, str]:
        # Hostnames repeat across Ray nodes on one machine; node ids not. Under Slurm, the Ray
        # node passes SLURMD_NODENAME on to its workers.
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
    """Keep the raylet's SIGTERM out of the driver's output. The raylet SIGTERMs a
    disconnected actor's worker (SIGKILL 200 ms later); Ray's handler raises SystemExit
    wherever the main thread is, and inside a weakref callback or a __del__ Python printed
    "Exception ignored in ... SystemExit: 1". So SIGTERM is ignored from the interpreter's
    exit on (atexit runs before module teardown and before Ray's own atexit shutdown), and
    before that an unraisable SystemExit is dropped; other unraisable exceptions still go to
    the previous hook."""
    previous = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        if not isinstance(unraisable.exc_value, SystemExit):
            previous(unraisable)

    atexit.register(signal.signal, signal.SIGTERM, signal.SIG_IGN)
    sys.unraisablehook = hook
