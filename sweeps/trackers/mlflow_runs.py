"""`--tracker mlflow`: one MLflow experiment per sweep (named after OUT), a parent run for the
sweep and, nested under it, a run per trial (flat config as params, metrics with step = epoch,
grid-point tags); after the analysis the parent run gets the outputs as artifacts. The parent
run's id is kept in OUT/mlflow.json, so `--resume` continues the same runs.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from sweeps.common import SweepError
from sweeps.trackers.base import Tracker, grid_points, member_result, metrics_of, tags_of

if TYPE_CHECKING:
    import pandas as pd

    from sweeps.cli import SweepArgs


def _local_store(uri: str) -> bool:
    return uri.startswith("sqlite:") or uri.startswith("file:") or "://" not in uri


class MLflowTracker(Tracker):
    name, package = "mlflow", "MLflow"

    def start(self, args: SweepArgs, experiment: str) -> None:
        recorded = (self.state(args.out) or {}).get("tracking_uri") if args.resume else None
        if args.tracking_uri and recorded is not None and args.tracking_uri != recorded:
            raise SweepError(f"--tracking-uri {args.tracking_uri}: the sweep in {args.out} "
                             f"logs to {recorded} (OUT/{self.name}.json)")
        previous = self.resumed(args, "MLflow at {tracking_uri}")
        if previous is not None:
            args.tracking_uri = previous["tracking_uri"]
            self.check_installed(args)
            return
        if "mlflow" not in args.tracker:
            return
        from mlflow.tracking import MlflowClient

        args.out.mkdir(parents=True, exist_ok=True)
        # Else a local store inside OUT. MLflow 3 refuses its old file store by default, so an
        # SQLite database: `mlflow ui --backend-store-uri` takes the same URI.
        uri = args.tracking_uri or f"sqlite:///{(args.out / 'mlflow.db').resolve()}"
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
        self.write_state(args.out, {
            "tracking_uri": uri, "experiment": name, "experiment_id": experiment_id,
            "parent_run_id": parent.info.run_id})

    def callback(self, state: dict, param_keys: tuple[str, ...]) -> object:
        return _trial_runs_callback()(state, param_keys)

    def finish(self, args: SweepArgs, state: dict, df: pd.DataFrame,
               written: list[Path]) -> None:
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

    def hints(self, state: dict) -> list[str]:
        uri = state["tracking_uri"]
        if _local_store(uri):
            return [f"MLflow: mlflow ui --backend-store-uri {shlex.quote(uri)}"]
        return [f"MLflow: {uri}, experiment {state['experiment']!r}"]


def _trial_runs_callback():
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient
    from ray.tune.logger import LoggerCallback

    class TrialRuns(LoggerCallback):
        """One MLflow run per grid point, tagged with its key: a later launch finds the
        point's run again and logs only the epochs it lacks."""

        def __init__(self, state: dict, param_keys: tuple[str, ...]) -> None:
            self.state, self.param_keys = state, param_keys
            self.client: MlflowClient | None = None  # made on the driver, at the first trial
            self.logged: dict[str, int] = {}  # run id -> last epoch logged
            self.runs: dict[str, list[str]] = {}  # Tune's trial id -> its points' runs

        def __getstate__(self) -> dict:
            return {**self.__dict__, "client": None}

        def _existing_run(self, key: str) -> str | None:
            runs = self.client.search_runs(
                [self.state["experiment_id"]],
                filter_string=(f"tags.trial_id = '{key}' and "
                               f"tags.`mlflow.parentRunId` = '{self.state['parent_run_id']}'"),
                max_results=1)
            return runs[0].info.run_id if runs else None

        def log_trial_start(self, trial) -> None:
            if self.client is None:
                self.client = MlflowClient(tracking_uri=self.state["tracking_uri"])
            if trial.trial_id in self.runs:
                return
            run_ids = []
            for key, config in grid_points(trial):
                run_id = self._existing_run(key)
                if run_id is None:
                    tags = {"mlflow.parentRunId": self.state["parent_run_id"],
                            "trial_id": key, "trial_name": str(trial), **tags_of(config)}
                    name = " ".join(f"{k}={config[k]}" for k in self.param_keys
                                    if k in config)
                    run_id = self.client.create_run(self.state["experiment_id"],
                                                    run_name=name or key,
                                                    tags=tags).info.run_id
                    params = [Param(k, str(v)) for k, v in sorted(config.items())]
                    for at in range(0, len(params), 100):  # MLflow's most a batch
                        self.client.log_batch(run_id, params=params[at:at + 100])
                else:
                    self.client.update_run(run_id, status="RUNNING")
                    history = self.client.get_metric_history(run_id, "train_acc")
                    self.logged[run_id] = max((m.step for m in history), default=0)
                run_ids.append(run_id)
            self.runs[trial.trial_id] = run_ids

        def log_trial_result(self, iteration: int, trial, result: dict) -> None:
            self.log_trial_start(trial)
            run_ids = self.runs[trial.trial_id]
            epoch = int(result.get("epoch", result.get("training_iteration", 0)))
            now = int(result.get("timestamp", 0) * 1000)
            for i, run_id in enumerate(run_ids):
                own = member_result(result, i) if len(run_ids) > 1 else result
                if own is None or epoch <= self.logged.get(run_id, 0):
                    continue  # a member that diverged earlier; or a restored row logged before
                metrics = [Metric(key, value, now, epoch)
                           for key, value in metrics_of(own).items()]
                self.client.log_batch(run_id, metrics=metrics)
                self.logged[run_id] = epoch

        def log_trial_end(self, trial, failed: bool = False) -> None:
            for run_id in self.runs.pop(trial.trial_id, []):
                self.client.set_terminated(run_id, status="FAILED" if failed else "FINISHED")

    return TrialRuns
