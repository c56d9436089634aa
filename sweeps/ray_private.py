"""Every Ray and Tune internal the sweeps rely on, and only those, each with what it relies
on and why (docs/DESIGN.md): Ray's processes out of the driver's process group, and no idle
workers and no callback tagging at a sweep's start (speed). tests/test_ray_adapter.py checks
each against the installed Ray, so an upgrade that changes one fails there, by name.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def ray_processes_in_own_sessions() -> Iterator[bool]:
    """While active, the processes Ray starts (GCS, raylet, monitors) run in sessions of
    their own; yields whether that is in effect. ray.init starts each through
    `ray._private.services.start_ray_process`, which looks up the module's `ConsolePopen` (a
    subprocess.Popen) at each call: a subclass adding start_new_session=True goes in its
    place for the duration. Only where Ray has kernel fate sharing
    (`ray._private.utils.detect_fate_sharing_support`: PR_SET_PDEATHSIG, so they still die
    with the driver); without it Ray's reaper ends them by the driver's process group, and
    they stay in it."""
    from ray._private import services, utils

    popen = getattr(services, "ConsolePopen", None)
    if popen is None or not utils.detect_fate_sharing_support():
        yield False
        return

    class OwnSession(popen):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **{**kwargs, "start_new_session": True})

    services.ConsolePopen = OwnSession
    try:
        yield True
    finally:
        services.ConsolePopen = popen


# A raylet prestarts one Python worker per CPU when the first driver connects (RayConfig
# `prestart_worker_first_driver`). Tune's trial actors never run in them: each carries a
# runtime env (ray/tune/execution/class_cache.py), so Ray starts a worker of that env for it.
PRESTART_ENV = "RAY_prestart_worker_first_driver"


def no_prestarted_workers() -> None:
    os.environ.setdefault(PRESTART_ENV, "0")


def skip_callback_usage_tags() -> bool:
    """Where Ray's usage statistics are off (the sweeps' default, sweeps/ray_init.py), leave out
    Tune's count of the run's callbacks by class: `ray.tune.tune.run` calls
    `ray.air._internal.usage.tag_callbacks`, which imports the MLflow, W&B, Comet and Aim
    integrations to compare classes, for a tag that is then never sent. MLflow's import alone
    was ~3 s of CPU at every sweep's start (docs/MEASURED.md, "The test suite's time").
    Returns whether it was left out."""
    from ray._common.usage.usage_lib import usage_stats_enabled
    from ray.air._internal import usage as air_usage

    if usage_stats_enabled():
        return False
    air_usage.tag_callbacks = lambda callbacks: False  # tag_callbacks' "no usage recorded"
    return True
