"""Run a grid of trials with Ray Tune and write the results contract (DESIGN.md).

Shared by every driver: it starts or joins Ray, runs the Tuner (or restores it with
`--resume`), turns each trial's per-epoch reports into rows of `OUT/results.parquet`, and calls
the analysis so one command yields results, tables and figures.
"""

from __future__ import annotations

import json
import logging
import math
import os
import pickle
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd

from analysis.results import OK_WARNING, critic_warning
from sweeps.cli import SweepArgs
from sweeps.common import SweepError, flat_config
from unbiased.benchmarks import all_specs

# Columns of results.parquet, in order: the contract of DESIGN.md plus what we add.
CONTRACT_COLUMNS = [
    "experiment", "trial_id", "benchmark", "method", "sigma", "lam", "K", "seed", "epoch",
    "mi", "train_acc", "test_acc", "time_s", "mi_eval", "loss_task", "mi_batch", "epochs",
    "start_epoch", "node", "status", "selected",
]
METHOD = "mi_backprop"  # the method of a trial whose config names none
EXPERIMENT_FILE = "experiment.json"


def fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def check_out_dir(args: SweepArgs, experiment: str) -> None:
    """Refuse to mix experiments in one results directory, and fail early if it is not
    writable, before anything is written into it."""
    out = args.out
    marker = out / EXPERIMENT_FILE
    if out.exists() and not out.is_dir():
        raise SweepError(f"--out {out} exists and is not a directory")
    if marker.exists() and not (args.resume or args.overwrite):
        raise SweepError(f"--out {out} already holds results of an earlier sweep; pass "
                         f"--resume to continue it or --overwrite to replace it")
    if marker.exists() and args.resume:
        previous = json.loads(marker.read_text()).get("experiment")
        if previous != experiment:
            raise SweepError(f"--out {out} holds experiment {previous!r}, not {experiment!r}")
    if args.resume:
        for message in repair_cut_off_state(storage_dir(args)):
            print(f"resume: {message}", flush=True)
    probe = out if out.exists() else next((p for p in out.parents if p.exists()), Path("."))
    if not probe.is_dir():
        raise SweepError(f"--out {out} is not writable: {probe} is not a directory")
    # Try a write instead of os.access, which says yes to root on read-only file systems.
    try:
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as exc:
        raise SweepError(f"--out {out} is not writable: {exc.strerror or exc}") from None


# Tune's files at the top of an experiment directory that `Tuner.restore` reads.
_TUNER_FILE = "tuner.pkl"
_STATE_PATTERNS = ("experiment_state-*.json", "basic-variant-state-*.json",
                   "searcher-state-*.pkl", "callback-states-*.pkl")


def _readable(path: Path) -> bool:
    """Whether a state file loads whole (Tune writes JSON or, whatever the suffix, pickle)."""
    try:
        data = path.read_bytes()
    except OSError:
        return False
    for load in (json.loads, pickle.loads):
        try:
            load(data)
            return True
        except Exception:
            pass
    return False


def _staged_copies(staging_root: Path, experiment: Path) -> dict[Path, Path]:
    """Relative path -> the newest file of that path in the driver's staging directories of
    `experiment` (one per Ray session that ran it). Every sweep of one driver has the same
    experiment name, so a staging directory counts only if it holds an experiment state
    file of this experiment's (their names carry the second its session started)."""
    own = {p.name for p in experiment.glob(_STATE_PATTERNS[0])}
    newest: dict[Path, Path] = {}
    for staging in staging_root.glob(
            f"session_*/artifacts/*/{experiment.name}/driver_artifacts"):
        if not own & {p.name for p in staging.glob(_STATE_PATTERNS[0])}:
            continue
        for path in staging.rglob("*"):
            rel = path.relative_to(staging)
            if path.is_file() and (rel not in newest
                                   or path.stat().st_mtime > newest[rel].stat().st_mtime):
                newest[rel] = path
    return newest


def repair_cut_off_state(storage: str, ray_temp: Path | None = None) -> list[str]:
    """Put back whole copies of the Tune files a kill cut off; return what was done.

    The driver writes Tune's experiment state and each trial's result.json/progress.csv in a
    staging directory under Ray's temp dir, then copies them into the experiment directory
    in place. A driver killed during that copy leaves cut-off files there: `Tuner.restore`
    cannot read a cut experiment state, and a cut (often empty) result.json loses the epochs
    reported before the kill. The staging file was whole before the copy began, so a stored
    file that is a proper prefix of it (or missing, or an unreadable state file) gets it
    back, atomically. A state file with no whole copy left cannot be resumed from (an older
    session's state may name checkpoints `num_to_keep` has deleted): a SweepError, before Ray.
    Only local storage: object stores never show a partly written file.
    """
    if "://" in storage or not Path(storage).is_dir():
        return []
    from ray._common.utils import get_default_ray_temp_dir  # where the driver stages them

    from analysis.io import atomic_write_bytes

    staging_root = ray_temp or Path(get_default_ray_temp_dir())
    done = []
    for experiment in sorted(p.parent for p in Path(storage).glob(f"*/{_TUNER_FILE}")):
        staged = _staged_copies(staging_root, experiment)
        state_files = {p.relative_to(experiment) for pattern in _STATE_PATTERNS
                       for p in experiment.glob(pattern)}
        put_back = []
        for rel, source in sorted(staged.items()):
            target = experiment / rel
            if not target.parent.is_dir():
                continue  # a trial Tune never stored: it starts afresh
            whole = source.read_bytes()
            stored = target.read_bytes() if target.is_file() else None
            if stored is None or (len(stored) < len(whole) and whole.startswith(stored)) or (
                    rel in state_files and not _readable(target) and _readable(source)):
                atomic_write_bytes(target, whole)
                put_back.append(str(rel))
        if put_back:
            shown = ", ".join(put_back[:3]) + (", ..." if len(put_back) > 3 else "")
            done.append(f"put back Tune's whole staging copies of {len(put_back)} file(s) "
                        f"of {experiment} that the kill cut off or left behind ({shown})")
        for rel in sorted(state_files):
            if not _readable(experiment / rel):
                raise SweepError(
                    f"cannot resume: Tune's saved state {experiment / rel} is cut off (the "
                    f"driver was killed while writing it) and no whole copy is left under "
                    f"{staging_root}; start the sweep again with --overwrite")
    return done


def _saved_state(exp_path: str) -> bool:
    """Whether Tune saved an experiment state to restore from (a driver killed in its first
    seconds leaves only tuner.pkl: there is nothing to resume, the sweep starts afresh)."""
    from ray import tune

    return tune.Tuner.can_restore(exp_path) and (
        "://" in exp_path or any(Path(exp_path).glob(_STATE_PATTERNS[0])))


def check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast on a host:port nobody listens on (ray.init would retry for minutes)."""
    target = address.split("://", 1)[-1]
    if address == "auto" or ":" not in target:
        return
    host, _, port = target.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except (OSError, ValueError) as exc:
        raise SweepError(f"cannot connect to Ray at --address {address}: "
                         f"{exc.strerror or exc}") from None


def init_ray(address: str | None) -> None:
    import ray

    if ray.is_initialized():
        return
    if address:
        check_reachable(address)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    try:
        if address:
            ray.init(address=address, include_dashboard=False, log_to_driver=True)
        else:
            # "local": always a fresh instance, never one found through RAY_ADDRESS or a
            # `ray start` on this machine (/tmp/ray/ray_current_cluster).
            _init_local_ray(ray)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SweepError(f"cannot connect to Ray at --address {address}: {first}") from None


def _init_local_ray(ray) -> None:
    """Start a local Ray whose processes (GCS, raylet, monitors) run in sessions of their own:
    a SIGTERM to the driver's process group (`timeout`, `kill -- -PGID`, a scheduler's cancel)
    then reaches the driver alone, and StopSignals saves the state before shutting them down.
    In the driver's group they died at once and the driver hung 60 s on the lost GCS, saving
    nothing. They still die with the driver: Ray sets PR_SET_PDEATHSIG on them."""
    from ray._private import services, utils

    popen = getattr(services, "ConsolePopen", None)  # what ray.init starts them with
    if popen is None or not utils.detect_fate_sharing_support():
        # Without PR_SET_PDEATHSIG Ray's reaper kills them by the driver's group: leave it.
        ray.init(address="local", include_dashboard=False)
        return

    class OwnSession(popen):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **{**kwargs, "start_new_session": True})

    services.ConsolePopen = OwnSession
    try:
        ray.init(address="local", include_dashboard=False)
    finally:
        services.ConsolePopen = popen


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
            config = flat_config(trial.config)
            return " ".join(f"{k}={config[k]}" for k in param_keys if k in config)

        def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
            if result.get("device_error"):
                print(f"[{time.time() - self.start:6.0f}s] {self._tag(trial)}: error: "
                      f"{result['device_error']} (not retried)", flush=True)
                return
            fields = [f"epoch {result.get('epoch')}/{trial.config.get('epochs')}"]
            for key in ("train_acc", "test_acc", "mi", "penalty", "mi_eval", "mi_eval_cond",
                        "eo"):
                value = result.get(key)
                if isinstance(value, float) and not math.isnan(value):
                    fields.append(f"{key} {value:.3f}")
            print(f"[{time.time() - self.start:6.0f}s] {self._tag(trial)}: "
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


def storage_dir(args: SweepArgs) -> str:
    """Where Tune keeps this sweep's trial state: OUT/tune, or STORAGE/<name of OUT> when a
    (shared) --storage-path is given, so sweeps with different OUT never share a Tune
    experiment directory there."""
    if args.storage_path:
        return args.storage_path.rstrip("/") + "/" + args.out.resolve().name
    return str((args.out / "tune").resolve())


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


def run_tuner(args: SweepArgs, experiment: str, trainable: Callable, param_space: dict,
              resources: dict[str, float], param_keys: tuple[str, ...] = ("lam", "seed"),
              n_trials: int = 0, search_alg=None, num_samples: int = 1):
    """Run (or with --resume restore) the sweep. `search_alg`/`num_samples` for searches
    (lambda_search.py); grids leave them at None/1."""
    from ray import tune

    from sweeps import trackers

    # Tune warns on every forced snapshot when num_to_keep is set; the checkpoints are small.
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")

    storage = storage_dir(args)
    trainable = tune.with_resources(trainable, resources)
    exp_path = storage.rstrip("/") + "/" + experiment
    restore = args.resume and _saved_state(exp_path)
    if args.resume and not restore:
        print(f"resume: nothing saved in {exp_path} yet; starting these trials from the "
              f"beginning", flush=True)
    if restore:
        print(f"resuming {exp_path}", flush=True)
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
            _order_restored_grid(tuner)
        done = sum(1 for r in before if _finished(r))
        print(f"resume: {done} of {len(before)} trials already finished; the others continue "
              f"from their last checkpoints", flush=True)
    else:
        tuner = tune.Tuner(
            trainable,
            param_space=param_space,
            tune_config=tune.TuneConfig(reuse_actors=True, scheduler=make_scheduler(args),
                                        search_alg=search_alg, num_samples=num_samples),
            run_config=tune.RunConfig(
                name=experiment, storage_path=storage,
                checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
                failure_config=tune.FailureConfig(max_failures=2),
                verbose=0,
                callbacks=[progress_callback(param_keys, n_trials),
                           *trackers.callbacks(args, param_keys)],
            ),
        )
    with StopSignals() as stop:
        try:
            grid = tuner.fit()
        except KeyboardInterrupt:  # a second signal, or one before Tune's loop listened
            if stop.received is None:
                raise
    if stop.received is not None:
        stop.exit(args)
    return grid


def order_saved_trials(exp_path: str) -> bool:
    """Put the trials of Tune's saved experiment state back in the grid's order; True if
    that changed a file. Tune saves them in a dict's order and, on restore, asks for actors
    for the waiting trials in that order (beside what the scheduler picks), so a resumed grid
    ran trials of seed 2 before those of seed 0. Local storage only; the JSON stays as Tune
    wrote it but for the order of `trial_data`."""
    from analysis.io import atomic_write_text
    from sweeps.scheduling import grid_position

    changed = False
    if "://" in exp_path:
        return changed
    for path in sorted(Path(exp_path).glob(_STATE_PATTERNS[0])):
        try:
            state = json.loads(path.read_text())
            trials = state["trial_data"]
            keyed = [(grid_position(json.loads(t[0])["trial_id"]), t) for t in trials]
        except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
            continue  # not a state this code knows: Tune reads it as it is
        ordered = [t for _, t in sorted(keyed, key=lambda item: item[0])]
        if ordered != trials:
            state["trial_data"] = ordered
            atomic_write_text(path, json.dumps(state))
            changed = True
    return changed


def _order_restored_grid(tuner) -> None:
    """A sweep saved before GridOrderScheduler existed restores Tune's plain FIFO (the
    scheduler is pickled with the run). Tuner.restore takes no scheduler, so put the grid's
    order in place of a default FIFO here; any other scheduler is left as saved."""
    from ray.tune.schedulers import FIFOScheduler

    from sweeps.scheduling import GridOrderScheduler

    config = getattr(getattr(tuner, "_local_tuner", None), "_tune_config", None)
    if config is not None and (config.scheduler is None or type(config.scheduler) is FIFOScheduler):
        config.scheduler = GridOrderScheduler()


class QuietUnstarted(logging.Filter):
    """Tune warns once per trial that has no results yet (a resumed or a stopped sweep: 100+
    lines for a Table 1 grid, above our own line on what finished and how to continue).
    While active (`when()` true), that one warning is dropped; every other record passes."""

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


class StopSignals:
    """SIGTERM (`timeout`, a batch scheduler, `kill`) and SIGINT (Ctrl-C) during a sweep: Tune
    stops the trials and saves its state (its SIGUSR1 handler does both), then the driver
    shuts down the Ray it started and says how to resume. Without this, SIGTERM killed the
    driver alone and left its trial workers training. A second signal stops at once."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.received: int | None = None
        self._before: dict[int, object] = {}
        self._quiet = QuietUnstarted(lambda: self.received is not None)

    def __enter__(self) -> StopSignals:
        # Tune's own SIGINT handler would hide a Ctrl-C from us; one path for both signals.
        self._env = os.environ.get("TUNE_DISABLE_SIGINT_HANDLER")
        os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
        for sig in self.SIGNALS:
            self._before[sig] = signal.signal(sig, self._handle)
        self._quiet.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._quiet.__exit__()
        for sig, handler in self._before.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        if self._env is None:
            os.environ.pop("TUNE_DISABLE_SIGINT_HANDLER", None)
        else:
            os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = self._env

    def _handle(self, signum: int, frame: object) -> None:
        if self.received is not None or signal.getsignal(signal.SIGUSR1) in (
                signal.SIG_DFL, signal.SIG_IGN, None):
            # A second signal, or one before Tune's loop is listening: stop now.
            self.received = signum
            raise KeyboardInterrupt
        self.received = signum
        print(f"{signal.Signals(signum).name} received: stopping the trials and saving the "
              f"sweep's state (send it again to stop at once)", file=sys.stderr, flush=True)
        signal.raise_signal(signal.SIGUSR1)  # Tune's handler: end the run after this step

    def exit(self, args: SweepArgs) -> None:
        import ray

        ray.shutdown()  # the trial workers and, for a local Ray, the Ray this driver started
        command = " ".join(sys.argv)
        if "--resume" not in sys.argv:
            command += " --resume"
        print(f"stopped by {signal.Signals(self.received).name}; the finished epochs are "
              f"saved in {args.out}. Continue with: python {command}", file=sys.stderr,
              flush=True)
        raise SystemExit(128 + int(self.received))


def _finished(result) -> bool:
    """A trial that reported its last epoch (or stopped itself as diverged) without error."""
    metrics = result.metrics or {}
    epochs = flat_config(result.config or {}).get("epochs")
    if result.error is not None or "epoch" not in metrics:
        return False  # a trial that never reported has no config in its result either
    return (metrics["epoch"] == epochs or bool(metrics.get("diverged"))
            or bool(metrics.get("device_error")))


def results_frame(result_grid, experiment: str, benchmark: str,
                  config_columns: dict[str, str],
                  done: Sequence[tuple[pd.DataFrame, dict, str]] = ()) -> pd.DataFrame:
    """One row per trial and epoch. `config_columns` maps result column -> config key.
    `done`: trials an earlier run finished (`--done`, sweeps/done.py) as (epoch rows, flat
    config, trial id), made rows here exactly as the trials Tune ran."""
    trials = []
    for result in result_grid:
        df = result.metrics_dataframe
        config = flat_config(result.config or {})
        if df is None or df.empty:
            df = pd.DataFrame({"epoch": [0]})
            trial_id = getattr(result, "path", "unknown").rstrip("/").split("/")[-1]
        else:
            trial_id = str(df["trial_id"].iloc[-1])
            # A restarted trial may have re-reported an epoch: keep the last report of each.
            df = df.drop_duplicates(subset="epoch", keep="last")
        trials.append((df, config, trial_id, result.error))
    trials += [(df, config, trial_id, None) for df, config, trial_id in done]
    frames = []
    for df, config, trial_id, error in trials:
        df = df.copy()
        df["trial_id"] = trial_id
        for column, key in config_columns.items():
            df[column] = config.get(key, math.nan)
        df["status"] = "ok" if error is None else f"error: {_one_line(error)}"
        # The trial's full config next to its numbers (reproducibility, issue 9).
        df["config"] = json.dumps(config, sort_keys=True, default=str)
        reported = "train_acc" in df.columns
        if (error is None and reported
                and int(df["epoch"].max()) < int(config.get("epochs", 0))):
            df["status"] = STOPPED_EARLY  # the scheduler (ASHA) stopped it
        if "diverged" in df.columns and df["diverged"].notna().any():
            # The trial stopped itself (NaN/inf loss or MI): analysis leaves it out.
            df["status"] = str(df["diverged"].dropna().iloc[-1])
        if "device_error" in df.columns and df["device_error"].notna().any():
            # The trial could not use the device it was given: stopped once, not retried.
            df["status"] = "error: " + str(df["device_error"].dropna().iloc[-1])
        if df["status"].iloc[0] == "ok":
            # Ran to the end, but its numbers come with a caveat (kept in every mean).
            warnings = [critic_warning(df)]
            if "selection_note" in df.columns and df["selection_note"].notna().any():
                warnings.append(str(df["selection_note"].dropna().iloc[-1]))
            if any(warnings):
                df["status"] = OK_WARNING + "; ".join(w for w in warnings if w)
        frames.append(df)
    df = pd.concat(frames, ignore_index=True)
    df["selected"] = selected_rows(df)
    df["experiment"] = experiment
    df["benchmark"] = benchmark
    df["method"] = df["method"].fillna(METHOD) if "method" in df.columns else METHOD
    if "K" in df.columns:
        df["K"] = df["K"].fillna(0)  # methods without K (K = 0, as the non-neural baselines)
    for col in CONTRACT_COLUMNS:
        if col not in df.columns:
            df[col] = math.nan
    df = df[CONTRACT_COLUMNS + [c for c in KEPT_COLUMNS if c in df.columns]]
    df = df.astype({"epoch": "int64", "K": "int64", "seed": "int64", "epochs": "int64",
                    "lam": "float64", "sigma": "float64", "trial_id": "string",
                    "node": "string", "status": "string"}, errors="ignore")
    for column in ("node_id", "machine"):
        if column in df.columns:
            df[column] = df[column].astype("string")
    return df.sort_values(["sigma", "lam", "K", "seed", "epoch"]).reset_index(drop=True)


# Columns results.parquet keeps beyond the contract, in this order (whichever trials, Tune's
# or taken over by --done, brought them): every registered benchmark's own metrics and data
# axes (unbiased/benchmarks/), then the generic ones.
KEPT_COLUMNS = (*dict.fromkeys(c for spec in all_specs() for c in spec.result_columns()
                               if c not in CONTRACT_COLUMNS),
                "node_id", "machine", "config",
                "mi_eval_cond", "selected_epoch", "penalty", "epoch_s", "eval_s",
                "mi_eval_s", "ckpt_s", "mi_floor", "mi_floor_cond", "selected_mi_eval",
                "selected_mi_eval_cond", "guarded_frac",
                # the critic ablation's axes (sweeps/critic_ablation.py)
                "mine_standardize", "mi_guard")


def selected_rows(df: pd.DataFrame) -> pd.Series:
    """One True per trial: the epoch the trial reported as `selected_epoch` (its label-free
    stopping rule's choice, or its last epoch); a trial that never got there (diverged,
    stopped early) has its last row marked."""
    chosen = (df.groupby("trial_id")["selected_epoch"].transform("max")
              if "selected_epoch" in df.columns else pd.Series(math.nan, index=df.index))
    last = df.groupby("trial_id")["epoch"].transform("max")
    return df["epoch"].eq(chosen.fillna(last)).astype(bool)
STOPPED_EARLY = "stopped early (scheduler)"


def all_ok(df: pd.DataFrame) -> bool:
    """No trial failed (a trial the scheduler stopped early did not fail; one that ran to the
    end with a warning did not either)."""
    status = df["status"].astype(str)
    return bool((status.isin(["ok", STOPPED_EARLY]) | status.str.startswith(OK_WARNING)).all())


def _one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return (text[-1] if text else type(err).__name__)[:300]


def provenance() -> dict[str, object]:
    """What produced these results: package versions and the git commit of this checkout
    ("unknown" when the code was shipped without its .git, as on some cluster nodes)."""
    import importlib.metadata
    import platform
    import subprocess

    versions = {"python": platform.python_version()}
    for dist in ("unbiased-mi", "torch", "torchvision", "ray", "pandas", "numpy", "pyarrow",
                 "optuna", "scikit-learn"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = "not installed"
    repo = Path(__file__).resolve().parents[1]

    def git(*cmd: str) -> str:
        try:
            return subprocess.run(["git", "-C", str(repo), *cmd], capture_output=True,
                                  text=True, timeout=10, check=True).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    commit = git("rev-parse", "HEAD") or "unknown"
    dirty = bool(git("status", "--porcelain", "--untracked-files=no")) if commit != "unknown" \
        else None
    return {"versions": versions, "git_commit": commit, "git_dirty": dirty,
            "command": " ".join(sys.argv)}


def write_outputs(args: SweepArgs, experiment: str, df: pd.DataFrame) -> list[Path]:
    from analysis import build_all
    from analysis.io import atomic_write_parquet, atomic_write_text

    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "results.parquet"
    record = {"experiment": experiment, "benchmark": args.benchmark, "preset": args.preset,
              "values": args.values, "written": time.strftime("%Y-%m-%dT%H:%M:%S"),
              **args.extra, **provenance()}
    meta = {"unbiased.experiment": json.dumps(record, default=str, sort_keys=True)}
    atomic_write_parquet(df, path, metadata=meta)
    atomic_write_text(args.out / EXPERIMENT_FILE, json.dumps(record, indent=2, default=str))
    written = [path]
    written += [Path(p) for p in build_all(args.out)]
    return written
