"""`--tracker wandb`: one W&B project per sweep (`--wandb-project`, default the name of OUT),
a run per grid point grouped under the sweep (flat config, grid-point tags, metrics with
step = epoch), and after the analysis a summary run holding the outputs. The driver logs from
one thread for all runs, so workers need no wandb and a trial costs no process of its own.
`--resume` continues the same runs (same ids; W&B keeps steps increasing, so a re-run epoch is
not logged twice). OUT/wandb.json keeps the project and group.
"""

from __future__ import annotations

import os
import queue
import shlex
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from sweeps.common import SweepError
from sweeps.trackers.base import Tracker, grid_points, member_result, metrics_of, tags_of

if TYPE_CHECKING:
    import pandas as pd

    from sweeps.cli import SweepArgs

UPLOAD_TIMEOUT_S = 300  # the runs' closing at the end (online: the last epochs' upload)
RUN_DIR = "wandb"  # under OUT: wandb.init(dir=OUT) keeps its runs in OUT/wandb


class WandbTracker(Tracker):
    name = package = "wandb"

    def check_installed(self, args: SweepArgs) -> None:
        """wandb installed, and online an API key (else the callback fails once trials run)."""
        super().check_installed(args)
        import wandb

        if os.environ.get("WANDB_MODE") in ("offline", "disabled"):
            return
        if not os.environ.get("WANDB_API_KEY") and not _logged_in(wandb):
            raise SweepError("--tracker wandb: no W&B API key (set WANDB_API_KEY or run "
                             "`wandb login`), or run offline with WANDB_MODE=offline and "
                             "upload later with `wandb sync`")

    def start(self, args: SweepArgs, experiment: str) -> None:
        recorded = self.state(args.out) if args.resume else None
        if recorded and args.wandb_project and args.wandb_project != recorded["project"]:
            raise SweepError(f"--wandb-project {args.wandb_project}: the sweep in {args.out} "
                             f"logs to project {recorded['project']} (OUT/{self.name}.json)")
        if self.resumed(args, "W&B project {project}") is not None:
            self.check_installed(args)
            return
        if "wandb" not in args.tracker:
            return
        name = args.out.resolve().name
        self.write_state(args.out, {
            "project": args.wandb_project or name, "group": name, "sweep": experiment,
            "benchmark": args.benchmark, "preset": args.preset,
            "dir": str(args.out.resolve())})

    def callback(self, state: dict, param_keys: tuple[str, ...]) -> object:
        return _trial_runs_callback()(state, param_keys)

    def finish(self, args: SweepArgs, state: dict, df: pd.DataFrame,
               written: list[Path]) -> None:
        """The summary run: the outputs as one artifact, table.parquet as a W&B table."""
        import pandas as pd
        import wandb

        run = wandb.init(project=state["project"], group=state["group"], dir=state["dir"],
                         id=f"{state['group']}-summary", name=f"{state['group']} (summary)",
                         job_type="analysis", resume="allow",
                         mode=os.environ.get("WANDB_MODE") or None,
                         config={"sweep": state["sweep"], "benchmark": state["benchmark"],
                                 "preset": state["preset"]})
        artifact = wandb.Artifact(f"{state['group']}-results", type="results")
        for path in map(Path, written):
            if path.is_file():
                rel = path.relative_to(args.out) if path.is_relative_to(args.out) else path
                artifact.add_file(str(path), name=str(rel))
        run.log_artifact(artifact)
        tidy = args.out / "table.parquet"
        if tidy.is_file():
            run.log({"table": wandb.Table(dataframe=pd.read_parquet(tidy).astype(str))})
        if "selected" in df.columns:
            for row in df[df["selected"].astype(bool)].itertuples():
                run.summary[f"selected_epoch/{row.trial_id}"] = int(row.epoch)
                run.summary[f"status/{row.trial_id}"] = str(row.status)
        run.finish()

    def hints(self, state: dict) -> list[str]:
        runs = Path(state["dir"]) / RUN_DIR
        if os.environ.get("WANDB_MODE") == "offline":
            return [f"W&B: offline runs in {runs}; upload: wandb sync --include-offline "
                    f"{shlex.quote(str(runs))}/offline-run-*"]
        return [f"W&B: project {state['project']!r}, group {state['group']!r} (run files "
                f"in {runs})"]


class RunWriter:
    """The W&B runs of a sweep's trials, written by one driver thread in queue order: Tune's
    loop only queues (online, a wandb.init is a request to the server). A run that cannot be
    written is a warning line, not a failed sweep."""

    def __init__(self) -> None:
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._write, name="wandb-runs", daemon=True)
        self._thread.start()

    def put(self, kind: str, run_id: str, payload: object = None) -> None:
        """Queue a run's "start" (wandb.init's kwargs), "log" ((metrics, step)) or "finish"."""
        self._tasks.put((kind, run_id, payload))

    def close(self, timeout_s: float) -> bool:
        """Finish every open run and wait until wandb-core has written them out and exited;
        False if it had not by `timeout_s`."""
        self._tasks.put(None)
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _write(self) -> None:
        import wandb

        runs: dict[str, object] = {}
        while (task := self._tasks.get()) is not None:
            kind, run_id, payload = task
            try:
                if kind == "start" and run_id not in runs:
                    runs[run_id] = wandb.init(id=run_id, reinit="create_new", **payload)
                elif kind == "log" and run_id in runs:
                    metrics, step = payload
                    runs[run_id].log(metrics, step=step)
                elif kind == "finish" and run_id in runs:
                    runs.pop(run_id).finish()
            except Exception as e:  # W&B down or refusing: the sweep goes on without it
                print(f"warning: W&B run {run_id}: {kind} failed: {e}", file=sys.stderr,
                      flush=True)
        for run_id, run in runs.items():
            try:
                run.finish()
            except Exception as e:
                print(f"warning: W&B run {run_id}: finish failed: {e}", file=sys.stderr,
                      flush=True)
        # finish() only posts each run's close to wandb-core, which writes the run file out
        # when it handles it; teardown waits for that, and for wandb-core to exit.
        wandb.teardown()


def _trial_runs_callback():
    from ray.tune.logger import LoggerCallback

    class TrialRuns(LoggerCallback):
        """One W&B run per grid point, its id the point's trial_id in results.parquet."""

        def __init__(self, state: dict, param_keys: tuple[str, ...]) -> None:
            self.state = state
            self.param_keys = param_keys
            self.points: dict[str, list[tuple[str, dict]]] = {}  # trial id -> its points
            self.writer: RunWriter | None = None  # started with the first trial

        def __getstate__(self) -> dict:
            return {**self.__dict__, "writer": None}  # a thread is not saved with the Tuner

        def _points_of(self, trial) -> list[tuple[str, dict]]:
            if trial.trial_id not in self.points:
                self.points[trial.trial_id] = grid_points(trial)
            return self.points[trial.trial_id]

        def log_trial_start(self, trial) -> None:
            if self.writer is None:
                self.writer = RunWriter()
            state = self.state
            for run_id, config in self._points_of(trial):
                name = " ".join(f"{k}={config[k]}" for k in self.param_keys if k in config)
                self.writer.put("start", run_id, dict(
                    name=name or run_id, resume="allow", allow_val_change=True,
                    group=state["group"], project=state["project"], dir=state["dir"],
                    job_type="trial", tags=[f"{k}={v}" for k, v in tags_of(config).items()],
                    config={k: v for k, v in config.items() if v is None or isinstance(
                        v, str | int | float | bool | list | tuple | dict)},
                    # Every run is in the driver: the system metrics would be the driver
                    # node's, and its console output in every run.
                    settings={"console": "off", "x_disable_stats": True}))

        def log_trial_result(self, iteration: int, trial, result: dict) -> None:
            if self.writer is None or trial.trial_id not in self.points:
                self.log_trial_start(trial)
            points = self._points_of(trial)
            if len(points) == 1:  # a bundle has two members at least
                own = [(points[0][0], result)]
            else:  # a bundle: each member's part, None once it has diverged
                own = [(run_id, member_result(result, i)) for i, (run_id, _) in
                       enumerate(points)]
            for run_id, part in own:
                if part is not None:
                    epoch = part.get("epoch", part.get("training_iteration"))
                    self.writer.put("log", run_id, (metrics_of(part), int(epoch)))

        def log_trial_end(self, trial, failed: bool = False) -> None:
            if self.writer is not None:
                for run_id, _ in self._points_of(trial):
                    self.writer.put("finish", run_id)

        def on_experiment_end(self, trials, **info) -> None:
            """Every run finished, also when a signal stopped the sweep (it ends no trial)."""
            if self.writer is not None and not self.writer.close(UPLOAD_TIMEOUT_S):
                print(f"warning: W&B runs not closed after {UPLOAD_TIMEOUT_S} s; their run "
                      f"files in {Path(self.state['dir']) / RUN_DIR} may lack the last epochs",
                      file=sys.stderr, flush=True)
            self.writer = None

    return TrialRuns


def _logged_in(wandb) -> bool:
    try:
        return bool(wandb.Api().api_key)
    except Exception:  # no settings, no network: not logged in as far as we can tell
        return False
