"""Each Ray and Tune internal sweeps/ray_private.py relies on, checked against the installed Ray:
a Ray upgrade that renames, reshapes or drops one fails here, by name, instead of in a sweep
(Ray's processes in the driver's group, idle workers, callback usage tags). Shapes are read off
Ray itself (signatures, class attributes, the names a function looks up). The public API
the sweeps use instead of internals (the stop on a signal) is checked on one tiny Tune run."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sweeps import ray_private

STEPS = 20  # reports of a trial in the tiny run, STEP_S apart: stopped long before the last
STEP_S = 0.5


def params(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


def looks_up(fn, name: str) -> bool:
    """Whether `fn`'s own code reads `name` (a global or an attribute)."""
    return name in fn.__code__.co_names


@pytest.mark.ray
def test_the_sweeps_stopper_ends_tunes_run_at_its_next_step(ray_local, tmp_path):
    """StopSignals sets STOP on SIGTERM/SIGINT; the stopper every sweep's Tuner runs with
    (Tune's public Stopper) then ends the whole run: the trial running stops after a step,
    the waiting ones never start."""
    import ray.cloudpickle
    from ray import tune

    from sweeps import signals

    def report_steps(config: dict) -> None:  # local: Ray's workers cannot import this file
        for step in range(1, STEPS + 1):
            tune.report({"step": step, "x": config["x"]})
            time.sleep(STEP_S)

    class StopAtFirstResult(tune.Callback):
        def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
            signals.STOP.set()

    stopper = signals.stopper()
    assert ray.cloudpickle.loads(ray.cloudpickle.dumps(stopper)).stop_all() is False
    signals.STOP.clear()
    try:
        grid = tune.Tuner(
            tune.with_resources(report_steps, {"cpu": 2}),  # one at a time
            param_space={"x": tune.grid_search([0, 1, 2])},
            run_config=tune.RunConfig(name="stop", storage_path=str(tmp_path), verbose=0,
                                      stop=stopper, callbacks=[StopAtFirstResult()])).fit()
    finally:
        signals.STOP.clear()
    steps = [r.metrics["step"] for r in grid if "step" in (r.metrics or {})]
    assert len(steps) == 1, steps  # the others never started
    assert steps[0] < STEPS  # the run ended after a step, not the last


def test_tune_names_the_trials_without_results_in_this_warning():
    from ray.tune.analysis import experiment_analysis

    from sweeps.signals import QuietUnstarted

    assert experiment_analysis.logger.name == QuietUnstarted.LOGGER
    assert QuietUnstarted.MESSAGE in inspect.getsource(experiment_analysis)


@pytest.mark.ray
def test_a_local_ray_names_its_session_after_the_driver(ray_local):
    from ray._common.utils import get_default_ray_temp_dir

    from tests.processes import driver_sessions, ray_temp_dir

    assert params(get_default_ray_temp_dir) == []
    assert driver_sessions(ray_temp_dir(), os.getpid())


# -- Tune's usage tags ------------------------------------------------------------------------

def test_tunes_callback_count_imports_mlflow_and_is_left_out_without_usage_stats():
    # In a process of its own: in this one a sweep may have imported MLflow, or left the
    # count out, already.
    code = """
import os, sys
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
from ray.tune import tune
from ray.tune.logger import LoggerCallback
from sweeps import ray_private
from tests.test_ray_adapter import looks_up
assert looks_up(tune.run, "tag_callbacks")
assert looks_up(tune.air_usage.tag_callbacks, "_count_callbacks")
assert looks_up(tune.air_usage._count_callbacks, "MLflowLoggerCallback")  # imports MLflow
assert ray_private.skip_callback_usage_tags()
tune.air_usage.tag_callbacks([LoggerCallback()])  # as ray.tune.tune.run calls it
print("mlflow" in sys.modules)
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).parents[1])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["False"]


# -- Ray's processes in sessions of their own --------------------------------------------------

def test_ray_starts_its_processes_through_a_popen_that_can_be_replaced():
    from ray._private import services, utils

    popen = services.ConsolePopen
    assert issubclass(popen, subprocess.Popen)
    assert looks_up(services.start_ray_process, "ConsolePopen")  # at each call
    assert params(utils.detect_fate_sharing_support) == []
    with ray_private.ray_processes_in_own_sessions() as in_effect:
        assert in_effect == bool(utils.detect_fate_sharing_support())
        if in_effect:
            proc = services.ConsolePopen([sys.executable, "-c", "import time; time.sleep(30)"])
            try:
                assert os.getsid(proc.pid) == proc.pid != os.getsid(0)
            finally:
                proc.kill()
                proc.wait()
    assert services.ConsolePopen is popen


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG: Linux")
def test_ray_has_fate_sharing_on_linux():
    from ray._private import utils

    assert utils.detect_fate_sharing_support()


# A sweep's local Ray, watched for 4 s before any trial: the Python workers under its driver.
NO_TRIAL_YET = """
import os, time
from sweeps.ray_init import init_local_ray
from tests.processes import descendants

init_local_ray()
workers = set()
for _ in range(8):
    time.sleep(0.5)
    for pid in descendants(os.getpid()):
        try:
            argv = open(f"/proc/{pid}/cmdline").read().split("\\0")
        except OSError:
            continue
        if argv[0].startswith("ray::IDLE") or argv[1:2] and "_worker.py" in argv[1]:
            workers.add(" ".join(argv[:2]))
print("workers:", sorted(workers))
"""


@pytest.mark.ray
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads /proc (Linux)")
def test_a_sweeps_local_ray_starts_no_worker_before_a_trial_asks():
    """Prestarted workers would be idle processes: a trial actor never runs in one (Tune gives
    it a runtime env of its own)."""
    env = {k: v for k, v in os.environ.items() if k != ray_private.PRESTART_ENV}
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-c", NO_TRIAL_YET], cwd=root, capture_output=True,
                          text=True, timeout=120, env={**env, "PYTHONPATH": str(root)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "workers: []" in proc.stdout, proc.stdout[-2000:]


def test_the_adapter_is_the_only_place_that_reaches_into_ray():
    """No other module names one of Ray's private modules, Tune's execution internals or
    its storage context (a DeveloperAPI: a trial's record is found from its config)."""
    import re

    private = re.compile(r"\bray\.(_[a-z]\w*|\w+\._internal|tune\.(execution|impl))\b"
                         r"|\bget_storage\(|\bexperiment_fs_path\b|\bstorage_filesystem\b"
                         r"|_WandbLoggingActor|_QueueItem|_logger_actor_cls|\._trial_runs\b"
                         r"|_trial_logging_futures|_start_logging_actor|self\.mlflow_util\b")
    root = Path(__file__).resolve().parents[1]
    offenders = [f"{path.relative_to(root)}: {m.group(0)}"
                 for folder in ("sweeps", "trainables", "bench", "analysis", "unbiased", "tests")
                 for path in sorted((root / folder).rglob("*.py"))
                 # tests/processes.py: where Ray keeps its sessions, to check none is left
                 if path.name not in ("ray_private.py", "processes.py", Path(__file__).name)
                 for m in [private.search(path.read_text())] if m]
    assert not offenders, offenders
