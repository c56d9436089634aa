"""Experiment trackers (`--tracker mlflow,wandb`): a `Tracker` subclass and a TRACKERS line
each. TensorBoard needs none: Tune writes its event files beside the trials.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from sweeps.trackers.base import Tracker
from sweeps.trackers.mlflow_runs import MLflowTracker
from sweeps.trackers.wandb_runs import WandbTracker

if TYPE_CHECKING:
    import pandas as pd

    from sweeps.cli import SweepArgs

TRACKERS: dict[str, Tracker] = {"mlflow": MLflowTracker(), "wandb": WandbTracker()}


def active(args: SweepArgs) -> list[Tracker]:
    return [t for t in TRACKERS.values() if t.active(args)]


def with_state(args: SweepArgs) -> list[tuple[Tracker, dict]]:
    """The active trackers with the state their `start` recorded."""
    return [(t, state) for t in active(args) if (state := t.state(args.out)) is not None]


def check_installed(args: SweepArgs) -> None:
    for tracker in active(args):
        tracker.check_installed(args)


def start(args: SweepArgs, experiment: str) -> None:
    for tracker in TRACKERS.values():  # each also finds a resumed sweep's own runs
        tracker.start(args, experiment)


def callbacks(args: SweepArgs, param_keys: tuple[str, ...]) -> list:
    return [tracker.callback(state, param_keys) for tracker, state in with_state(args)]


def finish(args: SweepArgs, df: pd.DataFrame, written: list[Path]) -> None:
    for tracker, state in with_state(args):
        tracker.finish(args, state, df, written)


def hints(args: SweepArgs, storage: str) -> list[str]:
    """The commands that show this sweep: TensorBoard on Tune's event files (none where no
    Tune run was needed), then each tracker's."""
    local = "://" not in storage
    events = not local or any(Path(storage).rglob("events.out.tfevents.*"))
    lines = [f"TensorBoard: tensorboard --logdir {shlex.quote(storage)}"] if events else []
    for tracker, state in with_state(args):
        lines += tracker.hints(state)
    return lines
