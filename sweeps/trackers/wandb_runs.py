"""`--tracker wandb`: the sweep logged to Weights & Biases as it runs.

One W&B project per sweep (`--wandb-project`, default the name of OUT), one run per trial
(each member of a `--bundle` trial has its own),
all grouped under the sweep (group = the name of OUT), each run's id its Tune trial id: its
flat config, tags for its grid point (`method=mi_backprop`, `sigma=0.03`, ... as MLflow's),
every metric it reports per epoch (step = epoch; an epoch without a value has no point).
After the analysis a summary run of the group (job type `analysis`) holds the results, tables
and figures as one artifact, `table.parquet` as a W&B table, and each trial's selected epoch.

Ray Tune's `WandbLoggerCallback` does the logging (one logging actor per trial on the driver's
node, so workers need no wandb). The run files go to OUT/wandb. `WANDB_MODE=offline` needs no
account: the driver's last lines say how to upload them (`wandb sync`). `--resume` continues
the same runs (same ids, `resume="allow"`); an epoch a trial re-runs after a stop is not
logged twice (W&B keeps steps increasing). OUT/wandb.json keeps the project and group.
"""

from __future__ import annotations

import json
import os
import shlex
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from sweeps import ray_private
from sweeps.common import SweepError, flat_config
from sweeps.trackers.base import Tracker, grid_points, member_result, metrics_of, tags_of

if TYPE_CHECKING:
    import pandas as pd

    from sweeps.cli import SweepArgs

STATE_FILE = "wandb.json"
EXTRA = "pip install 'unbiased-mi[wandb]' (in a checkout: pip install -e '.[wandb]')"
# How long the driver waits at the end for the logging actors to close their runs (offline:
# seconds; online: the upload of the last epochs).
UPLOAD_TIMEOUT_S = 300
RUN_DIR = "wandb"  # under OUT: wandb.init(dir=OUT) keeps its runs in OUT/wandb


def _state(out: Path) -> dict | None:
    path = out / STATE_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def _tags(config: dict) -> list[str]:
    return [f"{k}={v}" for k, v in tags_of(config).items()]


class WandbTracker(Tracker):
    name = "wandb"
    extra = "wandb"

    def check_installed(self, args: SweepArgs) -> None:
        """wandb installed, and online an API key (Ray's callback would fail only once the
        trials start)."""
        try:
            import wandb
        except ImportError:
            raise SweepError(f"--tracker wandb needs wandb, which is not installed: {EXTRA}"
                             ) from None
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
                             f"logs to project {recorded['project']} (OUT/{STATE_FILE})")
        if self.resumed(args, "W&B project {project}") is not None:
            self.check_installed(args)
            return
        if "wandb" not in args.tracker:
            return
        from analysis.io import atomic_write_text

        args.out.mkdir(parents=True, exist_ok=True)
        name = args.out.resolve().name
        atomic_write_text(args.out / STATE_FILE, json.dumps({
            "project": args.wandb_project or name, "group": name, "sweep": experiment,
            "benchmark": args.benchmark, "preset": args.preset,
            "dir": str(args.out.resolve())}, indent=2))

    def callbacks(self, args: SweepArgs, param_keys: tuple[str, ...]) -> list:
        state = _state(args.out)
        return [] if state is None else [_trial_runs_callback()(state, param_keys)]

    def finish(self, args: SweepArgs, df: pd.DataFrame, written: list[Path]) -> None:
        """The summary run: the written files as one artifact, table.parquet as a W&B table,
        each trial's selected epoch and status in its summary."""
        state = _state(args.out)
        if state is None:
            return
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

    def hints(self, args: SweepArgs) -> list[str]:
        state = _state(args.out)
        if state is None:
            return []
        runs = Path(state["dir"]) / RUN_DIR
        if os.environ.get("WANDB_MODE") == "offline":
            return [f"W&B: offline runs in {runs}; upload: wandb sync --include-offline "
                    f"{shlex.quote(str(runs))}/offline-run-*"]
        return [f"W&B: project {state['project']!r}, group {state['group']!r} (run files "
                f"in {runs})"]


def _epoch_actor() -> type:
    """The logging actor Ray runs for each trial: its own metrics at step = its epoch."""
    return ray_private.wandb_epoch_actor(metrics_of)


@dataclass(frozen=True)
class MemberTrial:
    """A `--bundle` member as the W&B callback sees a trial: its own id (the trial's +
    "_m<i>", as in results.parquet), config and logging actor."""

    trial_id: str
    local_path: str
    config: dict = field(hash=False, compare=False)

    def __str__(self) -> str:
        return self.trial_id


def _trial_runs_callback():
    """The callback class, built on first use: importing Ray's integration imports wandb."""

    class TrialRuns(ray_private.wandb_callback(_epoch_actor())):
        """One W&B run per grid point (a trial, or each member of a `--bundle` trial), id =
        its trial id, config = its flat config, grid-point tags."""

        def __init__(self, state: dict, param_keys: tuple[str, ...]) -> None:
            super().__init__(project=state["project"], group=state["group"],
                             dir=state["dir"], resume="allow", job_type="trial")
            self.param_keys = param_keys
            # The driver's WANDB_MODE, passed on: a Ray started before it was set would not
            # hand it to the logging actors.
            self.mode = os.environ.get("WANDB_MODE") or None
            self.members: dict = {}  # a bundle trial -> its MemberTrials

        def on_experiment_end(self, trials, **info) -> None:
            """Tell every logging actor still open to finish its run first: a sweep stopped
            by a signal ends no trial, and Ray's callback would wait for those actors up to
            its upload timeout (30 min) before the driver could exit."""
            ray_private.wandb_stop_actors(self, UPLOAD_TIMEOUT_S)
            super().on_experiment_end(trials, **info)

        def _members_of(self, trial) -> list[MemberTrial] | None:
            """A bundle trial's members (None for any other trial, and for a member)."""
            if isinstance(trial, MemberTrial):
                return None
            points = grid_points(trial)
            if points[0][0] == trial.trial_id:
                return None
            if trial not in self.members:
                self.members[trial] = [MemberTrial(trial_id, trial.local_path, config)
                                       for trial_id, config in points]
            return self.members[trial]

        def log_trial_start(self, trial) -> None:
            members = self._members_of(trial)
            for point in members or [trial]:
                config = flat_config(point.config)
                name = " ".join(f"{k}={config[k]}" for k in self.param_keys if k in config)
                ray_private.wandb_start_actor(
                    self, point, id=point.trial_id, name=name or str(point),
                    resume="allow", allow_val_change=True,
                    group=self.group, project=self.project, dir=self.kwargs["dir"],
                    job_type="trial", tags=_tags(config), mode=self.mode,
                    config={k: v for k, v in config.items() if _plain(v)})

        def log_trial_result(self, iteration: int, trial, result: dict) -> None:
            members = self._members_of(trial)
            if members is None:
                super().log_trial_result(iteration, trial, result)
                return
            for i, member in enumerate(members):
                own = member_result(result, i)
                if own is not None:  # None: it diverged earlier
                    super().log_trial_result(iteration, member, own)

        def log_trial_end(self, trial, failed: bool = False) -> None:
            for point in self._members_of(trial) or [trial]:
                super().log_trial_end(point, failed)

    return TrialRuns


def _logged_in(wandb) -> bool:
    try:
        return bool(wandb.Api().api_key)
    except Exception:  # no settings, no network: not logged in as far as we can tell
        return False


def _plain(value: object) -> bool:
    return value is None or isinstance(value, str | int | float | bool | list | tuple | dict)


# ------------------------------------------------------------------ reading offline runs

def offline_records(path: Path) -> Iterator[object]:
    """The records of one offline run file (OUT/wandb/offline-run-*/run-*.wandb), parsed
    with wandb's own protobuf (`wandb.proto.wandb_internal_pb2.Record`). The file is a
    LevelDB-style log (wandb's "transaction log"): a 7-byte header, then 32 KiB blocks of
    chunks (CRC, length, type: full / first / middle / last)."""
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path} is not a W&B run file")
    block, pos, parts = 32768, 7, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a chunk header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 0:  # zero padding to the end of the block
            pos += (block - pos % block) % block
            continue
        parts = chunk if kind in (1, 2) else parts + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(parts)
            yield record


def offline_history(path: Path) -> tuple[str, dict[int, dict[str, float]]]:
    """(run id, {step: {metric: value}}) of one offline run file."""
    run_id, history = "", {}
    for record in offline_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run_id = record.run.run_id
        elif kind == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json)
                     for i in record.history.item}
            step = int(record.history.step.num) if record.history.HasField("step") else \
                int(items.get("_step", -1))
            history.setdefault(step, {}).update(
                {k: v for k, v in items.items() if not k.startswith("_")})
    return run_id, history
