"""What every tracker is. A tracker logs a sweep as it runs (Tune callbacks on the driver, so
trials never talk to it) and then attaches the results; its state in OUT/<name>.json lets
`--resume` continue the same runs.
"""

from __future__ import annotations

import importlib
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING

from analysis.io import atomic_write_text
from analysis.specs import DATA_AXES
from sweeps.common import SweepError
from unbiased.settings import POINT_KEY, flat_config, member_key

if TYPE_CHECKING:
    import pandas as pd

    from sweeps.cli import SweepArgs

# Tune's own bookkeeping in every result: not metrics of the trial.
NOT_METRICS = frozenset({"timestamp", "pid", "done", "training_iteration",
                         "iterations_since_restore", "time_since_restore", "epoch",
                         "should_checkpoint", "checkpoint_dir_name", "config"})
# Grid-point keys that become tags.
TAG_KEYS = ("method", *DATA_AXES, "lam", "K", "seed")


def number(value: object) -> bool:
    """A finite number: an epoch without a value (mi_eval before its first estimate) has no
    point in a history rather than a NaN one."""
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(float(value)))


def metrics_of(result: dict) -> dict[str, float]:
    return {k: float(v) for k, v in result.items() if k not in NOT_METRICS and number(v)}


def grid_points(trial) -> list[tuple[str, dict]]:
    """(key, flat config) of each grid point a Tune trial trains. The key is its record's,
    not Tune's trial id: every launch of a sweep logs a point into the same run."""
    from trainables.record import trial_key
    from unbiased.trial import MEMBERS_KEY, member_configs

    config = flat_config(trial.config)
    if MEMBERS_KEY not in config:
        point = trial.config.get(POINT_KEY)
        return [(trial_key([point]) if point else trial.trial_id, config)]
    return [(trial_key([member]), full) for member, full
            in zip(config[MEMBERS_KEY], member_configs(config), strict=True)]


def member_result(result: dict, index: int) -> dict | None:
    """A bundle member's part of a trial's result, None once it has diverged."""
    prefix = f"{member_key(index)}/"
    own = {k[len(prefix):]: v for k, v in result.items() if k.startswith(prefix)}
    return own if "epoch" in own else None


def tags_of(config: dict) -> dict[str, str]:
    return {k: str(config[k]) for k in TAG_KEYS if k in config}


class Tracker:
    """One tracker. `name` is its `--tracker` value, its module's and its extra's name;
    `package` names it in the error where it is not installed. The methods after `start`
    are called only where `start` recorded the tracker's `state`."""

    name: str = ""
    package: str = ""

    def active(self, args: SweepArgs) -> bool:
        return self.name in args.tracker

    def state(self, out: Path) -> dict | None:
        path = out / f"{self.name}.json"
        return json.loads(path.read_text()) if path.is_file() else None

    def write_state(self, out: Path, state: dict) -> None:
        atomic_write_text(out / f"{self.name}.json", json.dumps(state, indent=2))

    def resumed(self, args: SweepArgs, where: str) -> dict | None:
        """On --resume, the recorded state, this tracker added to args.tracker when the sweep
        was started with it; None for a new sweep. `where` names what it logs to."""
        previous = self.state(args.out) if args.resume else None
        if args.resume and previous is None and self.name in args.tracker:
            raise SweepError(f"--tracker {self.name} on --resume: the sweep in {args.out} "
                             f"was started without it, and the trials it finished would be "
                             f"missing there; start a new sweep with --tracker {self.name}")
        if previous is not None and self.name not in args.tracker:
            print(f"resume: logging to {where.format(**previous)}, as the sweep was started",
                  flush=True)
            args.tracker = (*args.tracker, self.name)
        return previous

    def check_installed(self, args: SweepArgs) -> None:
        """Raise SweepError (one line naming the extra) when asked for but not installed."""
        try:
            importlib.import_module(self.name)
        except ImportError:
            raise SweepError(f"--tracker {self.name} needs {self.package}, which is not "
                             f"installed: pip install 'unbiased-mi[{self.name}]' (in a "
                             f"checkout: pip install -e '.[{self.name}]')") from None

    def start(self, args: SweepArgs, experiment: str) -> None:
        """Before Ray: create (or on --resume find) the sweep's runs."""

    def callback(self, state: dict, param_keys: tuple[str, ...]) -> object:
        """The Tune callback that logs the trials (its class built on first use: importing Ray
        Tune and MLflow takes seconds, which a driver stopping at a bad flag should not spend)."""
        raise NotImplementedError

    def finish(self, args: SweepArgs, state: dict, df: pd.DataFrame,
               written: list[Path]) -> None:
        """After the analysis: each trial's selected epoch, the results files attached."""

    def hints(self, state: dict) -> list[str]:
        """The driver's last lines: how to look at (or upload) what was logged."""
        return []
