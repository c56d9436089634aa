"""`--tracker mlflow`: the sweep logged to MLflow as it runs.

One MLflow experiment per sweep (named after OUT), one parent run for the sweep and, nested
under it, one run per trial: the trial's flat config as params, every metric it reports as a
per-epoch history (step = epoch), tags for its grid point. After the analysis the parent run
gets the tables, results and figures as artifacts and every trial run its `selected_epoch`.

Ray Tune's `MLflowLoggerCallback` does the logging on the driver (trials never talk to MLflow,
so a cluster needs no MLflow on its workers); the subclass below adds the nesting, the tags,
and a resumed sweep's continuation of its own runs. The parent run's id is kept in
OUT/mlflow.json, so `--resume` and the analysis find the same runs.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from sweeps import ray_private
from sweeps.common import SweepError
from sweeps.trackers.base import Tracker, grid_points, member_result, metrics_of, tags_of

if TYPE_CHECKING:
    import pandas as pd

    from sweeps.cli import SweepArgs

STATE_FILE = "mlflow.json"
EXTRA = "pip install 'unbiased-mi[mlflow]' (in a checkout: pip install -e '.[mlflow]')"


def default_uri(out: Path) -> str:
    """A local store inside OUT. MLflow 3 refuses its old file store by default, so an SQLite
    database: `mlflow ui --backend-store-uri` takes the same URI."""
    return f"sqlite:///{(out / 'mlflow.db').resolve()}"


def _local_store(uri: str) -> bool:
    return uri.startswith("sqlite:") or uri.startswith("file:") or "://" not in uri


def check_installed(args: SweepArgs) -> None:
    """`--tracker mlflow` without MLflow: one line naming the extra, before Ray starts."""
    try:
        import mlflow  # noqa: F401
    except ImportError:
        raise SweepError(f"--tracker mlflow needs MLflow, which is not installed: {EXTRA}"
                         ) from None


def _state(out: Path) -> dict | None:
    path = out / STATE_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def start(args: SweepArgs, experiment: str) -> None:
    """Create (or on --resume find) the sweep's MLflow experiment and parent run; record them
    in OUT/mlflow.json. Adds mlflow to args.tracker on --resume of a sweep started with it
    (Tune restores a sweep's loggers as they were first set up)."""
    if args.resume and args.tracking_uri and (_state(args.out) or {}).get(
            "tracking_uri", args.tracking_uri) != args.tracking_uri:
        raise SweepError(f"--tracking-uri {args.tracking_uri}: the sweep in {args.out} "
                         f"logs to {_state(args.out)['tracking_uri']} (OUT/{STATE_FILE})")
    previous = MLflowTracker().resumed(args, "MLflow at {tracking_uri}")
    if previous is not None:
        args.tracking_uri = previous["tracking_uri"]
        check_installed(args)
        return
    if "mlflow" not in args.tracker:
        return
    from mlflow.tracking import MlflowClient

    from analysis.io import atomic_write_text

    args.out.mkdir(parents=True, exist_ok=True)
    uri = args.tracking_uri or default_uri(args.out)
    name = args.out.resolve().name
    try:
        client = MlflowClient(tracking_uri=uri)
        found = client.get_experiment_by_name(name)
        if found is not None:
            experiment_id = found.experiment_id
        else:
            # A local store keeps its artifacts beside it in OUT (not in the working
            # directory, MLflow's default); a server decides for itself.
            location = ((args.out / "mlartifacts").resolve().as_uri() if _local_store(uri)
                        else None)
            experiment_id = client.create_experiment(name, artifact_location=location)
        parent = client.create_run(experiment_id, run_name=name, tags={
            "sweep": experiment, "benchmark": args.benchmark, "preset": args.preset,
            "out": str(args.out.resolve())})
    except Exception as exc:  # MLflow raises many types for an unreachable or bad store
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SweepError(f"cannot log to MLflow at {uri}: {first[:300]}") from None
    args.tracking_uri = uri
    atomic_write_text(args.out / STATE_FILE, json.dumps({
        "tracking_uri": uri, "experiment": name, "experiment_id": experiment_id,
        "parent_run_id": parent.info.run_id}, indent=2))


def callbacks(args: SweepArgs, param_keys: tuple[str, ...]) -> list:
    """The Tune callback that logs every trial (none before start())."""
    state = _state(args.out)
    if state is None:
        return []
    return [_trial_runs_callback()(state, param_keys)]


def _trial_runs_callback():
    """The callback class, built on first use: importing Ray's integration imports MLflow."""
    from ray.air.integrations.mlflow import MLflowLoggerCallback

    class TrialRuns(MLflowLoggerCallback):
        """Ray's MLflow logger with one nested run per grid point (a trial's, or each member
        of a `--bundle` trial's, with the member's trial id) that a resumed sweep continues:
        a point already logged (same trial id, same parent run) gets its run back, and
        epochs it already logged are not logged twice."""

        def __init__(self, state: dict, param_keys: tuple[str, ...]) -> None:
            super().__init__(tracking_uri=state["tracking_uri"],
                             experiment_name=state["experiment"])
            self.parent_run_id = state["parent_run_id"]
            self.param_keys = param_keys

        def setup(self, *args, **kwargs) -> None:
            super().setup(*args, **kwargs)
            self._logged: dict[str, int] = {}  # run id -> last epoch logged
            self._runs: dict = {}  # trial -> the run of each grid point it trains

        def _client(self):
            return ray_private.mlflow_client(self)

        def _existing_run(self, trial_id: str) -> str | None:
            runs = self._client().search_runs(
                [ray_private.mlflow_util(self).experiment_id],
                filter_string=(f"tags.trial_id = '{trial_id}' and "
                               f"tags.`mlflow.parentRunId` = '{self.parent_run_id}'"),
                max_results=1)
            return runs[0].info.run_id if runs else None

        def log_trial_start(self, trial) -> None:
            trial_runs, util = ray_private.mlflow_trial_runs(self), ray_private.mlflow_util(self)
            if trial in trial_runs:
                return
            run_ids = []
            for trial_id, config in grid_points(trial):
                run_id = self._existing_run(trial_id)
                if run_id is None:
                    tags = {"mlflow.parentRunId": self.parent_run_id,
                            "trial_id": trial_id, "trial_name": str(trial)}
                    tags.update(tags_of(config))
                    name = " ".join(f"{k}={config[k]}" for k in self.param_keys
                                    if k in config)
                    run_id = util.start_run(run_name=name or str(trial), tags=tags).info.run_id
                    util.log_params(run_id=run_id, params_to_log=config)
                else:
                    client = self._client()
                    client.update_run(run_id, status="RUNNING")
                    history = client.get_metric_history(run_id, "train_acc")
                    self._logged[run_id] = max((m.step for m in history), default=0)
                run_ids.append(run_id)
            self._runs[trial] = run_ids
            trial_runs[trial] = run_ids[0]  # Ray's own record of the trial's run

        def log_trial_result(self, iteration: int, trial, result: dict) -> None:
            from mlflow.entities import Metric

            run_ids = self._runs[trial]
            epoch = int(result.get("epoch", result.get("training_iteration", 0)))
            now = int(result.get("timestamp", 0) * 1000)
            for i, run_id in enumerate(run_ids):
                own = member_result(result, i) if len(run_ids) > 1 else result
                if own is None or epoch <= self._logged.get(run_id, 0):
                    continue  # a member that diverged earlier; or re-reported after a restart
                metrics = [Metric(key, value, now, epoch)
                           for key, value in metrics_of(own).items()]
                self._client().log_batch(run_id, metrics=metrics)
                self._logged[run_id] = epoch

        def log_trial_end(self, trial, failed: bool = False) -> None:
            for run_id in self._runs.pop(trial, []):
                ray_private.mlflow_util(self).end_run(run_id=run_id,
                                                      status="FAILED" if failed else "FINISHED")

    return TrialRuns


def finish(args: SweepArgs, df: pd.DataFrame, written: list[Path]) -> None:
    """After the analysis: each trial run's selected epoch and status as tags, the sweep's
    results, tables and figures as artifacts of the parent run, which ends."""
    state = _state(args.out)
    if state is None:
        return
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=state["tracking_uri"])
    parent = state["parent_run_id"]
    runs = client.search_runs([state["experiment_id"]],
                              filter_string=f"tags.`mlflow.parentRunId` = '{parent}'",
                              max_results=10_000)
    by_trial = {run.data.tags.get("trial_id"): run.info.run_id for run in runs}
    selected = df[df["selected"].astype(bool)] if "selected" in df.columns else df.iloc[0:0]
    for row in selected.itertuples():
        run_id = by_trial.get(str(row.trial_id))
        if run_id is not None:
            client.set_tag(run_id, "selected_epoch", str(int(row.epoch)))
            client.set_tag(run_id, "status", str(row.status))
    for path in written:
        path = Path(path)
        if path.is_file():
            rel = path.parent.relative_to(args.out) if path.is_relative_to(args.out) else None
            client.log_artifact(parent, str(path),
                                artifact_path=None if rel in (None, Path(".")) else str(rel))
    client.set_terminated(parent, status="FINISHED")


def hints(args: SweepArgs) -> list[str]:
    """The command that opens the MLflow UI on the sweep's store."""
    state = _state(args.out)
    if state is None:
        return []
    uri = state["tracking_uri"]
    if _local_store(uri):
        return [f"MLflow: mlflow ui --backend-store-uri {shlex.quote(uri)}"]
    return [f"MLflow: {uri}, experiment {state['experiment']!r}"]


class MLflowTracker(Tracker):
    name = "mlflow"
    extra = "mlflow"

    def check_installed(self, args: SweepArgs) -> None:
        check_installed(args)

    def start(self, args: SweepArgs, experiment: str) -> None:
        start(args, experiment)

    def callbacks(self, args: SweepArgs, param_keys: tuple[str, ...]) -> list:
        return callbacks(args, param_keys)

    def finish(self, args: SweepArgs, df: pd.DataFrame, written: list[Path]) -> None:
        finish(args, df, written)

    def hints(self, args: SweepArgs) -> list[str]:
        return hints(args)
