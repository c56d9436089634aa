"""Each Ray and Tune internal sweeps/ray_private.py relies on, checked against the installed Ray:
a Ray upgrade that renames, reshapes or drops one fails here, by name, instead of in a sweep
(a resume that cannot repair or reorder Tune's state, a stop that saves nothing, a lost
MLflow run). Shapes are read off Ray itself (signatures, class attributes, the names a function
looks up); file and JSON layouts and the stop signal off one tiny real Tune run."""

from __future__ import annotations

import inspect
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from sweeps import ray_private

STEPS = 20  # reports of a trial in the tiny run, STEP_S apart: stopped long before the last
STEP_S = 0.5


def params(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


def looks_up(fn, name: str) -> bool:
    """Whether `fn`'s own code reads `name` (a global or an attribute)."""
    return name in fn.__code__.co_names


@pytest.fixture(scope="module")
def tiny_run(ray_local, tmp_path_factory):
    """Three trials, one at a time (2 CPUs each on the 2 of ray_local), under the grid-order
    scheduler; at the first result a callback notes the signal handlers in place and asks
    Tune to stop (ray_private.ask_tune_to_stop), as StopSignals does on SIGTERM."""
    from ray import tune

    from sweeps.scheduling import GridOrderScheduler

    def report_steps(config: dict) -> None:  # local: Ray's workers cannot import this file
        for step in range(1, STEPS + 1):
            tune.report({"step": step, "x": config["x"]})
            time.sleep(STEP_S)

    seen: dict[str, object] = {}

    class Watch(tune.Callback):
        def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
            if "listening" not in seen:
                seen["listening"] = ray_private.tune_listens_for_stop()
                seen["sigint"] = signal.getsignal(signal.SIGINT)
                ray_private.ask_tune_to_stop()

    class Messages(logging.Handler):
        def __init__(self) -> None:
            super().__init__()
            self.messages: list[str] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.messages.append(record.getMessage())

    storage = tmp_path_factory.mktemp("tune")
    name = f"ray_adapter_{os.getpid()}"  # one of its own among the machine's Ray sessions
    messages = Messages()
    logger = logging.getLogger(ray_private.UNSTARTED_LOGGER)
    logger.addHandler(messages)
    before = signal.signal(ray_private.STOP_SIGNAL, signal.SIG_DFL)  # an earlier fit's
    listening_before = ray_private.tune_listens_for_stop()
    sigint_before = signal.getsignal(signal.SIGINT)
    env = os.environ.get("TUNE_DISABLE_SIGINT_HANDLER")
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"  # as StopSignals sets it
    try:
        trainable = tune.with_resources(report_steps, {"cpu": 2})
        tuner = tune.Tuner(
            trainable, param_space={"x": tune.grid_search([0, 1, 2])},
            tune_config=tune.TuneConfig(scheduler=GridOrderScheduler()),
            run_config=tune.RunConfig(name=name, storage_path=str(storage), verbose=0,
                                      callbacks=[Watch()]))
        grid = tuner.fit()
        grid = list(grid)
    finally:
        logger.removeHandler(messages)
        signal.signal(ray_private.STOP_SIGNAL, before)
        if env is None:
            os.environ.pop("TUNE_DISABLE_SIGINT_HANDLER", None)
        else:
            os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = env
    return SimpleNamespace(name=name, exp=storage / name, trainable=trainable, grid=grid,
                           seen=seen, messages=messages.messages,
                           listening_before=listening_before, sigint_before=sigint_before)


# -- Tune's experiment directory ---------------------------------------------------------------

def test_state_file_names_are_tunes():
    from ray.tune.callback import CallbackList
    from ray.tune.execution.tune_controller import TuneController
    from ray.tune.impl.tuner_internal import _TUNER_PKL
    from ray.tune.search.basic_variant import BasicVariantGenerator
    from ray.tune.search.searcher import Searcher

    assert ray_private.TUNER_FILE == _TUNER_PKL
    assert ray_private.STATE_PATTERNS == tuple(
        owner.CKPT_FILE_TMPL.format("*")
        for owner in (TuneController, BasicVariantGenerator, Searcher, CallbackList))
    assert ray_private.EXPERIMENT_STATE == ray_private.STATE_PATTERNS[0]


def test_a_tune_run_saves_its_files_and_trials_as_the_adapter_reads_them(tiny_run):
    exp = tiny_run.exp
    assert (exp / ray_private.TUNER_FILE).is_file()
    states = sorted(exp.glob(ray_private.EXPERIMENT_STATE))
    assert states and list(exp.glob(ray_private.STATE_PATTERNS[1]))
    state = json.loads(states[-1].read_text())
    entries = state[ray_private.TRIAL_DATA]
    assert len(entries) == 3  # every trial, the unstarted ones too
    for entry in entries:
        assert len(entry) == 2 and isinstance(json.loads(entry[1]), dict)
    saved = {ray_private.saved_trial_id(e) for e in entries}
    ran = {r.metrics["trial_id"] for r in tiny_run.grid if r.metrics}
    assert ran and ran <= saved
    assert all(r.error is None for r in tiny_run.grid)
    # the ids the grid-order scheduler sorts by: <run>_<position in the grid>
    assert sorted(i.rpartition("_")[2] for i in saved) == ["00000", "00001", "00002"]
    # the checkpoint a trial's run metadata names (none: this run reports without one), and
    # one named in its place, read back as Tune's restore reads it
    entry = list(entries[0])
    assert ray_private.saved_checkpoint_path(entry) is None
    named = str(exp / "trial" / "checkpoint_000001")
    ray_private.name_saved_checkpoint(entry, named, {"training_iteration": 2})
    assert ray_private.saved_checkpoint_path(entry) == named
    from ray.tune.trainable.metadata import _TrainingRunMetadata

    manager = _TrainingRunMetadata.from_json_state(entry[1]).checkpoint_manager
    assert manager.latest_checkpoint_result.checkpoint.path == named
    assert manager.latest_checkpoint_result.metrics == {"training_iteration": 2}


def test_the_driver_stages_tunes_files_where_the_repair_finds_them(tiny_run):
    staged = list(ray_private.staging_dirs(ray_private.ray_temp_dir(), tiny_run.name))
    assert staged, "no staging directory of the run"
    names = {p.name for p in tiny_run.exp.glob(ray_private.EXPERIMENT_STATE)}
    assert any(names & {p.name for p in d.glob(ray_private.EXPERIMENT_STATE)}
               for d in staged)
    assert any(list(d.glob("*/result.json")) for d in staged)


def test_a_local_ray_names_its_session_after_the_driver(ray_local):
    from ray._common.utils import get_default_ray_temp_dir

    assert params(get_default_ray_temp_dir) == []
    assert ray_private.driver_sessions(ray_private.ray_temp_dir(), os.getpid())


# -- Tune's run loop ---------------------------------------------------------------------------

def test_tune_stops_and_saves_on_the_stop_signal(tiny_run):
    assert not tiny_run.listening_before and tiny_run.seen["listening"]
    # the documented switch keeps Tune's SIGINT handler out (StopSignals handles SIGINT)
    assert tiny_run.seen["sigint"] == tiny_run.sigint_before
    steps = [r.metrics.get("step", 0) for r in tiny_run.grid if r.metrics]
    assert steps and max(steps) < STEPS, steps  # the run ended after the step, not the last


def test_tune_names_the_trials_without_results_in_this_warning(tiny_run):
    from ray.tune.analysis import experiment_analysis

    assert experiment_analysis.logger.name == ray_private.UNSTARTED_LOGGER
    assert any(m.startswith(ray_private.UNSTARTED_MESSAGE) for m in tiny_run.messages), \
        tiny_run.messages


def test_a_restored_tuner_keeps_its_tune_config_where_the_adapter_finds_it(tiny_run):
    from ray import tune

    from sweeps.scheduling import GridOrderScheduler

    tuner = tune.Tuner.restore(str(tiny_run.exp), tiny_run.trainable)
    config = ray_private.restored_tune_config(tuner)
    assert isinstance(config, tune.TuneConfig)
    assert isinstance(config.scheduler, GridOrderScheduler)  # pickled with the run


def test_a_scheduler_is_given_the_controller_and_asks_it_for_the_trials():
    from ray.tune.execution.tune_controller import TuneController
    from ray.tune.schedulers import FIFOScheduler

    assert params(FIFOScheduler.choose_trial_to_run) == ["self", "tune_controller"]
    assert params(TuneController.get_trials) == ["self"]
    controller = SimpleNamespace(get_trials=lambda: ["a", "b"])
    assert ray_private.controller_trials(controller) == ["a", "b"]


def test_a_trial_a_scheduler_pauses_as_it_is_added_waits_to_be_chosen():
    """ray_private.hold_trial: the controller asks the scheduler's on_trial_add before it
    files the trial under its status, and starts on its own only the PENDING ones."""
    import inspect

    from ray.tune.execution.tune_controller import TuneController

    add = inspect.getsource(TuneController.add_trial)
    assert add.index("on_trial_add(") < add.index("status_str_map[trial.status].add(trial)")
    start = inspect.getsource(TuneController._maybe_add_actors)
    assert "choose_trial_to_run(" in start and "self._pending_trials_list" in start
    assert "_paused_trials" not in start


def test_a_schedulers_mode_is_where_the_adapter_reads_it():
    from ray.tune.schedulers import ASHAScheduler

    assert ray_private.scheduler_mode(ASHAScheduler(metric="m", mode="max")) == "max"
    assert ray_private.scheduler_mode(ASHAScheduler(metric="m", mode="min")) == "min"


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


# -- MLflow through Ray's callback -------------------------------------------------------------

def test_rays_mlflow_callback_has_the_helper_the_tracker_uses(tmp_path):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient
    from ray.air.integrations.mlflow import MLflowLoggerCallback

    callback = MLflowLoggerCallback(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}",
                                    experiment_name="ray_adapter")
    callback.setup()
    util = ray_private.mlflow_util(callback)
    assert util.experiment_id is not None
    assert ray_private.mlflow_trial_runs(callback) == {}
    assert isinstance(ray_private.mlflow_client(callback), MlflowClient)
    assert {"run_name", "tags"} <= set(params(util.start_run))
    assert {"run_id", "params_to_log"} <= set(params(util.log_params))
    assert {"run_id", "status"} <= set(params(util.end_run))


# -- the cluster launcher's config check -------------------------------------------------------

def test_the_cluster_config_check_takes_a_config():
    from ray.autoscaler._private.util import prepare_config, validate_config

    assert params(prepare_config)[:1] == ["config"]
    assert params(validate_config)[:1] == ["config"]
    with pytest.raises(Exception):  # noqa: B017 - Ray raises its schema's own error types
        ray_private.check_cluster_config({"not": "a cluster"})


def test_the_adapter_is_the_only_place_that_reaches_into_ray():
    """No other module names one of Ray's private modules or Tune's execution internals."""
    import re

    private = re.compile(r"\bray\.(_[a-z]\w*|\w+\._internal|tune\.(execution|impl))\b"
                         r"|_WandbLoggingActor|_QueueItem|_logger_actor_cls|\._trial_runs\b"
                         r"|_trial_logging_futures|_start_logging_actor|self\.mlflow_util\b")
    root = Path(__file__).resolve().parents[1]
    offenders = [f"{path.relative_to(root)}: {m.group(0)}"
                 for folder in ("sweeps", "trainables", "bench", "analysis", "unbiased", "tests")
                 for path in sorted((root / folder).rglob("*.py"))
                 if path.name not in ("ray_private.py", Path(__file__).name)
                 for m in [private.search(path.read_text())] if m]
    assert not offenders, offenders
