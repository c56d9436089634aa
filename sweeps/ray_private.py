"""Every Ray and Tune internal the sweeps rely on, and only those, in one place.

Ray's public API does not cover a few things the sweeps need: repairing and reordering Tune's
saved state on --resume, a graceful stop on SIGTERM, Ray's processes out of the driver's
process group, and the per-trial MLflow runs. What they need from Ray's internals
(private modules, underscore attributes, file and JSON layouts, undocumented behaviour) is
here, each with what it relies on and why; nothing else in the repository reaches past Ray's
public API. tests/test_ray_adapter.py checks each against the installed Ray, so a Ray upgrade
that changes one fails there, by name, instead of in a sweep.

Ray is imported inside the functions: the drivers' `--help` and the analysis never load it.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# -- Tune's experiment directory ---------------------------------------------------------------
# What `Tuner.restore` reads at the top of an experiment directory: the pickled Tuner
# (ray.tune.impl.tuner_internal._TUNER_PKL) and the state files named by the CKPT_FILE_TMPL of
# TuneController, BasicVariantGenerator, Searcher and CallbackList, "{}" their session's start.
# The experiment state comes first: the repair and the reordering of a resumed sweep read it.
TUNER_FILE = "tuner.pkl"
EXPERIMENT_STATE = "experiment_state-*.json"
STATE_PATTERNS = (EXPERIMENT_STATE, "basic-variant-state-*.json", "searcher-state-*.pkl",
                  "callback-states-*.pkl")
# The experiment state's JSON (TuneController.save_to_dir): "trial_data" lists one entry per
# trial, [the trial's state as JSON (Trial.get_json_state; it holds "trial_id"), its run
# metadata as JSON]. On restore Tune asks for the waiting trials' actors in this list's order.
TRIAL_DATA = "trial_data"


def saved_trial_id(entry: list) -> str:
    """The trial id of one entry of an experiment state's TRIAL_DATA."""
    return json.loads(entry[0])["trial_id"]


def saved_checkpoint_path(entry: list) -> str | None:
    """The latest checkpoint one entry of TRIAL_DATA names (None: none yet). The run metadata
    (ray.tune.trainable.metadata._TrainingRunMetadata, JSON by TuneFunctionEncoder) holds the
    trial's checkpoint manager cloudpickled (ray.train._internal.checkpoint_manager
    ._CheckpointManager), whose `_latest_checkpoint_result` is a _TrainingResult(checkpoint,
    metrics). Only for a state this sweep's Tune wrote: decoding it runs cloudpickle."""
    from ray.tune.utils.serialization import TuneFunctionDecoder

    metadata = TuneFunctionDecoder(allow_cloudpickle=True).decode(entry[1])
    latest = getattr(metadata.get("checkpoint_manager"), "_latest_checkpoint_result", None)
    return None if latest is None else latest.checkpoint.path


def name_saved_checkpoint(entry: list, path: str, metrics: dict) -> None:
    """Make a local directory `path` the latest and only checkpoint one entry of TRIAL_DATA
    names, reported with `metrics` (the trial's result row that came with it), re-encoded as
    Tune writes its run metadata (json.dumps(indent=2, cls=TuneFunctionEncoder)); the
    checkpoint manager's `_checkpoint_results` is what `num_to_keep` keeps."""
    from ray.train import Checkpoint
    from ray.train._internal.session import _TrainingResult
    from ray.tune.utils.serialization import TuneFunctionDecoder, TuneFunctionEncoder

    metadata = TuneFunctionDecoder(allow_cloudpickle=True).decode(entry[1])
    manager = metadata["checkpoint_manager"]
    before = manager._latest_checkpoint_result
    filesystem = before.checkpoint.filesystem if before is not None else None
    result = _TrainingResult(checkpoint=Checkpoint(path, filesystem=filesystem),
                             metrics=metrics)
    manager._latest_checkpoint_result = result
    manager._checkpoint_results = [result]
    entry[1] = json.dumps(metadata, indent=2, cls=TuneFunctionEncoder)


# -- where the driver stages Tune's files ------------------------------------------------------

def ray_temp_dir() -> Path:
    """Ray's default temp dir (/tmp/ray), where sessions live: ray._common.utils
    .get_default_ray_temp_dir, read without starting Ray."""
    from ray._common.utils import get_default_ray_temp_dir

    return Path(get_default_ray_temp_dir())


def staging_dirs(ray_temp: Path, experiment: str) -> Iterator[Path]:
    """The driver's staging directories of an experiment, one per Ray session that ran it.
    The driver writes the experiment state and each trial's result.json/progress.csv there
    first, then copies them into the experiment directory
    (ray.train._internal.storage.StorageContext.experiment_driver_staging_path:
    <ray temp>/session_<name>/artifacts/<start time>/<experiment>/driver_artifacts)."""
    return ray_temp.glob(f"session_*/artifacts/*/{experiment}/driver_artifacts")


def driver_sessions(ray_temp: Path, pid: int) -> list[Path]:
    """The session directories of the Ray a driver started: a head node names its session
    session_<start time>_<pid of the process that started it> (ray._private.node.Node)."""
    return sorted(ray_temp.glob(f"session_*_{pid}"))


# -- Ray's processes in sessions of their own --------------------------------------------------

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


# -- No idle workers for a local Ray ----------------------------------------------------------
# A raylet prestarts one Python worker per CPU when the first driver connects (RayConfig
# `prestart_worker_first_driver`, read from RAY_prestart_worker_first_driver by the raylet a
# ray.init starts). Tune's trial actors never run in them: each carries a runtime env (Tune's
# env vars, ray/tune/execution/class_cache.py), so Ray starts a worker of that env for it.
PRESTART_ENV = "RAY_prestart_worker_first_driver"


def no_prestarted_workers() -> None:
    """A Ray this process starts from now on prestarts no worker (unless PRESTART_ENV is
    already set)."""
    os.environ.setdefault(PRESTART_ENV, "0")


# -- Tune's run loop ---------------------------------------------------------------------------
# Tune's graceful stop: while Tuner.fit runs (on the main thread) Tune has a SIGUSR1 handler
# (ray.tune.tune._setup_signal_catching) that ends the run after the current step and saves
# the experiment state, as its SIGINT handler does (that one is documented and can be turned
# off with TUNE_DISABLE_SIGINT_HANDLER; SIGUSR1's is neither).
STOP_SIGNAL = signal.SIGUSR1


def tune_listens_for_stop() -> bool:
    """Whether Tune's stop handler is in place (Tuner.fit's loop has started)."""
    return signal.getsignal(STOP_SIGNAL) not in (signal.SIG_DFL, signal.SIG_IGN, None)


def ask_tune_to_stop() -> None:
    """Tune ends the run after this step and saves its state (see STOP_SIGNAL)."""
    signal.raise_signal(STOP_SIGNAL)


# -- Tune's usage tags -------------------------------------------------------------------------

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
    air_usage.tag_callbacks = _no_callback_tags
    return True


def _no_callback_tags(callbacks) -> bool:
    return False  # tag_callbacks' "no usage recorded"


# Tune's warning, when results are read, for each trial that has none yet (a resumed or a
# stopped grid): ray.tune.analysis.experiment_analysis's module logger, this text.
UNSTARTED_LOGGER = "ray.tune.analysis.experiment_analysis"
UNSTARTED_MESSAGE = "Failed to fetch metrics"


def restored_tune_config(tuner):
    """The TuneConfig a restored Tuner will run with (its scheduler pickled with the run;
    Tuner.restore takes none): `Tuner._local_tuner._tune_config`. None where the Tuner has no
    local one (Ray client mode)."""
    return getattr(getattr(tuner, "_local_tuner", None), "_tune_config", None)


def controller_trials(tune_controller) -> list:
    """All trials of the run, in Tune's list's order: the controller a scheduler's
    `choose_trial_to_run(tune_controller)` is given (ray.tune.execution.tune_controller
    .TuneController) answers `get_trials()`."""
    return tune_controller.get_trials()


def hold_trial(trial) -> None:
    """Keep a trial Tune has just added (a scheduler's `on_trial_add`) from starting until
    the scheduler's `choose_trial_to_run` returns it. Tune's controller starts every PENDING
    trial that fits (tune_controller.TuneController._maybe_add_actors) and files a trial
    under its status once `on_trial_add` returns; a PAUSED trial it starts only when the
    scheduler chooses it (a never-started one then starts fresh)."""
    from ray.tune.experiment import Trial

    trial.set_status(Trial.PAUSED)


def scheduler_mode(scheduler) -> str | None:
    """The mode ("min"/"max") a trial scheduler ranks its metric by: TrialScheduler keeps it
    in `_mode` (its metric has a public property, its mode none). Only the tests read it."""
    return scheduler._mode


# -- MLflow: one nested run per trial through Ray's callback -----------------------------------

def mlflow_util(callback):
    """Ray's MLflow helper of an MLflowLoggerCallback (`mlflow_util`, a
    ray.air._internal.mlflow._MLflowLoggerUtil, set up in the callback's setup()): used for
    `experiment_id`, `start_run(run_name=, tags=)`, `log_params(run_id=, params_to_log=)` and
    `end_run(run_id=, status=)`."""
    return callback.mlflow_util


def mlflow_client(callback):
    """The MlflowClient of the callback's tracking store: `mlflow_util._get_client()`."""
    return callback.mlflow_util._get_client()


def mlflow_trial_runs(callback) -> dict:
    """Trial -> MLflow run id, the callback's own map (`_trial_runs`, made in setup()): Ray's
    log_trial_result/log_trial_end find a trial's run there."""
    return callback._trial_runs


# -- the cluster launcher's config check (tests/test_cluster_yaml.py) --------------------------

def check_cluster_config(config: dict) -> dict:
    """cluster.yaml as `ray up` checks it, offline: Ray's AWS defaults merged in
    (ray.autoscaler._private.util.prepare_config), then its schema and rules
    (validate_config, raising on a fault). Returns the prepared config."""
    from ray.autoscaler._private.util import prepare_config, validate_config

    prepared = prepare_config(config)
    validate_config(prepared)
    return prepared


# -- what `ray up` ships to each node -----------------------------------------------------------
# The autoscaler's command runner turns the YAML's rsync_exclude and rsync_filter into rsync
# flags (SSHCommandRunner._create_rsync_filter_args, no state of the runner read) and runs
# `rsync -avz FLAGS SRC/ NODE:DST` for each file mount, a directory's source ending in "/".
def rsync_filter_args(cluster: dict) -> list[str]:
    """The rsync flags `ray up` uses for the file mounts of the cluster YAML `cluster`."""
    from ray.autoscaler._private.command_runner import SSHCommandRunner

    options = {"rsync_exclude": cluster.get("rsync_exclude"),
               "rsync_filter": cluster.get("rsync_filter")}
    return SSHCommandRunner._create_rsync_filter_args(None, options)
