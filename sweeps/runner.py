"""Run the trials a launch has to run with Ray Tune: a new Tuner every launch. Tune
schedules, restarts failed trials and runs searchers; it keeps no state a launch reads (the
trials' records do).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from sweeps import ray_private, trackers
from sweeps.cli import SweepArgs
from sweeps.ending import write_progress
from sweeps.outputs import storage_dir
from sweeps.results_frame import finished
from sweeps.signals import StopSignals, stopper
from trainables.record import RESTORED, RecordStore, records_root, trial_key_of
from unbiased.settings import RECORDS_KEY, flat_config, member_key


def run_tuner(args: SweepArgs, experiment: str, trainable: Callable, param_space: dict,
              resources: dict[str, float], param_keys: tuple[str, ...] = ("lam", "seed"),
              n_trials: int = 0, search_alg=None, num_samples: int = 1, n_done: int = 0):
    """Run the trials of `param_space`; `n_done` of the sweep's finished in earlier launches."""
    from ray import tune

    ray_private.skip_callback_usage_tags()
    storage = storage_dir(args)
    tuner = tune.Tuner(
        tune.with_resources(trainable, resources),
        # The trial's session finds its record there (trainables/tune_trial.py).
        param_space={**param_space, RECORDS_KEY: records_root(storage, experiment)},
        tune_config=tune.TuneConfig(reuse_actors=True, scheduler=make_scheduler(args),
                                    search_alg=search_alg, num_samples=num_samples),
        run_config=tune.RunConfig(
            name=experiment, storage_path=storage,
            failure_config=tune.FailureConfig(max_failures=args.max_failures),
            stop=stopper(), verbose=0,
            callbacks=[progress_callback(param_keys, n_trials + n_done, n_done,
                                         RecordStore.at(storage, experiment), experiment),
                       *trackers.callbacks(args, param_keys)],
        ),
    )
    grid = None
    with StopSignals(args) as stop:
        try:
            if stop.received is None:  # else a signal came before this run: none starts
                grid = tuner.fit()
        except KeyboardInterrupt:  # a second signal
            if stop.received is None:
                raise
    results = list(grid) if grid is not None else []
    write_progress(experiment, n_trials + n_done, n_done + sum(1 for r in results
                                                               if finished(r)))
    if stop.received is not None:
        if grid is None or len(results) < n_trials or not all(finished(r) for r in results):
            stop.exit()
        stop.watch.disarm()
        print("the stop signal came after every trial had finished: writing the results",
              flush=True)
    return grid


def make_scheduler(args: SweepArgs):
    """FIFO (trials start in grid order), or ASHA on train_acc per epoch."""
    if args.values.get("scheduler", "fifo") == "fifo":
        return None
    from ray.tune.schedulers import ASHAScheduler

    epochs = int(args["epochs"])
    return ASHAScheduler(time_attr="epoch", metric="train_acc", mode="max", max_t=epochs,
                         grace_period=max(1, epochs // 4), reduction_factor=3)


def progress_callback(param_keys: tuple[str, ...], n_trials: int, n_done: int = 0,
                      records: RecordStore | None = None, experiment: str = ""):
    """One line per trial per epoch instead of Tune's wide tables. A trial that ends here,
    not by a stop signal, is marked ended in its record; one that wrote its last epoch while
    a stop came runs again, so its rows reach the trackers then."""
    from ray import tune

    class Progress(tune.Callback):
        def __init__(self) -> None:
            self.done = n_done
            self.start = time.time()
            # Trials whose device could not start: failed, not ended, so --resume runs them.
            self.device_failed: set[str] = set()

        def _tag(self, trial) -> str:
            return " | ".join(_point_tag(point, param_keys)
                              for point in _points(flat_config(trial.config)))

        def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
            if result.get(RESTORED):
                return  # an epoch an earlier launch ran, told again to the trackers
            write_progress(experiment, n_trials, self.done, new_epochs=1)
            if result.get("device_error"):
                self.device_failed.add(trial.trial_id)
                print(f"[{time.time() - self.start:6.0f}s] {self._tag(trial)}: error: "
                      f"{result['device_error']} (not retried; --resume runs it again)",
                      flush=True)
                return
            points = _points(flat_config(trial.config))
            for i, point in enumerate(points):
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
            from sweeps import signals

            key = trial_key_of(trial.config)
            if (records is not None and key is not None and not signals.STOP.is_set()
                    and trial.trial_id not in self.device_failed):
                records.end(key, "ended")
            self.done = n_done + sum(1 for t in trials if t is trial
                                     or t.status == t.TERMINATED)
            write_progress(experiment, n_trials, self.done)
            print(f"[{time.time() - self.start:6.0f}s] finished {self.done}/{n_trials}: "
                  f"{self._tag(trial)}", flush=True)

        def on_trial_error(self, iteration, trials, trial, **info) -> None:
            print(f"[{time.time() - self.start:6.0f}s] trial failed: {self._tag(trial)} "
                  f"(Tune restarts it from its record's checkpoint while retries remain)",
                  flush=True)

    return Progress()


def _points(config: dict) -> list[dict]:
    from unbiased.trial import MEMBERS_KEY, member_configs

    return member_configs(config) if MEMBERS_KEY in config else [config]


def _point_tag(config: dict, param_keys: tuple[str, ...]) -> str:
    return " ".join(f"{k}={config[k]}" for k in param_keys if k in config)
