"""Run a grid of trials with Ray Tune: the Tuner, or on `--resume` Tune's saved one restored.

The sweep's flow (sweeps/core.py): check OUT (sweeps/outputs.py), start or join Ray
(sweeps/ray_init.py), `run_tuner` here, then the trials' reports as rows
(sweeps/results_frame.py) written out with the analysis (outputs.write_outputs). A stop by
signal is sweeps/signals.py; Tune's saved state made fit to resume is sweeps/tune_state.py;
the Ray internals all of them rely on are sweeps/ray_private.py.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable

from sweeps import ray_private
from sweeps.cli import SweepArgs
from sweeps.common import SweepError
from sweeps.ending import write_progress
from sweeps.outputs import storage_dir
from sweeps.results_frame import finished
from sweeps.signals import QuietUnstarted, StopSignals
from sweeps.tune_state import (
    name_checkpoints_on_disk,
    order_restored_grid,
    order_saved_trials,
    saved_state,
)
from unbiased.settings import flat_config


def run_tuner(args: SweepArgs, experiment: str, trainable: Callable, param_space: dict,
              resources: dict[str, float], param_keys: tuple[str, ...] = ("lam", "seed"),
              n_trials: int = 0, search_alg=None, num_samples: int = 1):
    """Run (or with --resume restore) the sweep. `search_alg`/`num_samples` for searches
    (lambda_search.py); grids leave them at None/1."""
    from ray import tune

    ray_private.skip_callback_usage_tags()
    # Tune warns on every forced snapshot when num_to_keep is set; the checkpoints are small.
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")

    storage = storage_dir(args)
    trainable = tune.with_resources(trainable, resources)
    exp_path = storage.rstrip("/") + "/" + experiment
    restore = args.resume and saved_state(exp_path)
    if args.resume and not restore:
        print(f"resume: nothing saved in {exp_path} yet; starting these trials from the "
              f"beginning", flush=True)
    if restore:
        tuner = restored_tuner(args, exp_path, trainable)
    else:
        tuner = new_tuner(args, experiment, storage, trainable, param_space, param_keys,
                          n_trials, search_alg, num_samples)
    grid = None
    with StopSignals(args) as stop:
        try:
            grid = tuner.fit()
        except KeyboardInterrupt:  # a second signal, or one before Tune's loop listened
            if stop.received is None:
                raise
    results = list(grid) if grid is not None else []
    write_progress(experiment, results, n_trials, finished)
    if stop.received is not None:
        if grid is None or len(results) < n_trials or not all(finished(r) for r in results):
            stop.exit()
        stop.watch.disarm()
        print("the stop signal came after every trial had finished: writing the results",
              flush=True)
    return grid


def new_tuner(args: SweepArgs, experiment: str, storage: str, trainable, param_space: dict,
              param_keys: tuple[str, ...], n_trials: int, search_alg, num_samples: int):
    """The sweep's Tuner: one checkpoint kept per trial, --max-failures restarts of a failed
    trial from it."""
    from ray import tune

    from sweeps import trackers

    return tune.Tuner(
        trainable,
        param_space=param_space,
        tune_config=tune.TuneConfig(reuse_actors=True, scheduler=make_scheduler(args),
                                    search_alg=search_alg, num_samples=num_samples),
        run_config=tune.RunConfig(
            name=experiment, storage_path=storage,
            checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
            failure_config=tune.FailureConfig(max_failures=args.max_failures),
            verbose=0,
            callbacks=[progress_callback(param_keys, n_trials),
                       *trackers.callbacks(args, param_keys)],
        ),
    )


def restored_tuner(args: SweepArgs, exp_path: str, trainable):
    """Tune's saved Tuner of the sweep (errored trials retried; under FIFO, its trials in the
    grid's order); says how many trials had finished."""
    from ray import tune

    print(f"resuming {exp_path}", flush=True)
    for named in name_checkpoints_on_disk(exp_path):
        print(f"resume: a kill had left Tune's state naming a deleted checkpoint; "
              f"{named}", flush=True)
    fifo = args.values.get("scheduler", "fifo") == "fifo"
    if fifo:
        order_saved_trials(exp_path)
    try:
        with QuietUnstarted():  # Tuner.restore reads the saved results too
            tuner = tune.Tuner.restore(exp_path, trainable, resume_errored=True)
            before = tuner.get_results()
    except RuntimeError:  # Tune could not read the state it saved (and hides why)
        raise SweepError(f"cannot resume: Tune cannot read its saved state in "
                         f"{exp_path}; start the sweep again with --overwrite") from None
    if fifo:
        order_restored_grid(tuner)
    done = sum(1 for r in before if finished(r))
    print(f"resume: {done} of {len(before)} trials already finished; the others continue "
          f"from their last checkpoints", flush=True)
    return tuner


def make_scheduler(args: SweepArgs):
    """The trial scheduler of `--scheduler`: FIFO in the grid's order, or ASHA on train_acc
    per epoch."""
    if args.values.get("scheduler", "fifo") == "fifo":
        from sweeps.scheduling import GridOrderScheduler

        return GridOrderScheduler()
    from ray.tune.schedulers import ASHAScheduler

    epochs = int(args["epochs"])
    return ASHAScheduler(time_attr="epoch", metric="train_acc", mode="max", max_t=epochs,
                         grace_period=max(1, epochs // 4), reduction_factor=3)


def progress_callback(param_keys: tuple[str, ...], n_trials: int):
    """One line per trial per epoch instead of Tune's wide tables."""
    from ray import tune

    class Progress(tune.Callback):
        def __init__(self) -> None:
            self.done = 0
            self.start = time.time()

        def setup(self, **info) -> None:
            # Tuner.restore brings back this object as pickled at the first start: count the
            # seconds of this run, not since then.
            self.start = time.time()

        def _tag(self, trial) -> str:
            return " | ".join(_point_tag(point, param_keys)
                              for point in _points(flat_config(trial.config)))

        def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
            if result.get("device_error"):
                print(f"[{time.time() - self.start:6.0f}s] {self._tag(trial)}: error: "
                      f"{result['device_error']} (not retried)", flush=True)
                return
            from unbiased.trial import member_key

            points = _points(flat_config(trial.config))
            for i, point in enumerate(points):
                # a bundle's member reports under "m<i>/" (unbiased/trial.py)
                prefix = f"{member_key(i)}/" if len(points) > 1 else ""
                if f"{prefix}epoch" not in result:
                    continue  # a bundle member that diverged earlier
                fields = [f"epoch {result.get('epoch')}/{trial.config.get('epochs')}"]
                for key in ("train_acc", "test_acc", "mi", "penalty", "mi_eval",
                            "mi_eval_cond", "eo", "diverged"):
                    value = result.get(prefix + key)
                    if isinstance(value, float) and not math.isnan(value):
                        fields.append(f"{key} {value:.3f}")
                    elif isinstance(value, str):
                        fields.append(value)
                print(f"[{time.time() - self.start:6.0f}s] {_point_tag(point, param_keys)}: "
                      + ", ".join(fields), flush=True)

        def on_trial_complete(self, iteration, trials, trial, **info) -> None:
            # Counted from Tune's trials, not kept: a resumed run goes on from the trials the
            # earlier runs finished (this object comes back as pickled at the first start).
            self.done = sum(1 for t in trials if t is trial or t.status == t.TERMINATED)
            print(f"[{time.time() - self.start:6.0f}s] finished {self.done}/{n_trials}: "
                  f"{self._tag(trial)}", flush=True)

        def on_trial_error(self, iteration, trials, trial, **info) -> None:
            print(f"[{time.time() - self.start:6.0f}s] trial failed: {self._tag(trial)} "
                  f"(Tune restarts it from its last checkpoint while retries remain)",
                  flush=True)

    return Progress()


def _points(config: dict) -> list[dict]:
    """A trial's grid points: its own config, or a bundle's members' (unbiased/trial.py)."""
    from unbiased.trial import MEMBERS_KEY, member_configs

    return member_configs(config) if MEMBERS_KEY in config else [config]


def _point_tag(config: dict, param_keys: tuple[str, ...]) -> str:
    return " ".join(f"{k}={config[k]}" for k in param_keys if k in config)
