"""The order in which a grid's trials start (Ray imported here, not by the drivers' `--help`)."""

from __future__ import annotations

from ray.tune.experiment import Trial
from ray.tune.schedulers import FIFOScheduler

from sweeps import ray_private
from unbiased.settings import POINT_KEY, WARM_FROM


def grid_position(trial_id: object) -> tuple[int, str]:
    """Where a trial sits in its grid: Tune numbers the trials of one run as it creates them,
    in the grid's order ("1f693_00042": the 43rd); an id of another form sorts after, by id."""
    _, _, number = str(trial_id).rpartition("_")
    return (int(number), "") if number.isdigit() else (1 << 62, str(trial_id))


class GridOrderScheduler(FIFOScheduler):
    """Tune's FIFO scheduler, but the waiting trial that starts next is always the first in
    the grid's order (seed by seed, the first method first: sweeps.core.GridSpec.points),
    on --resume too. Tune's FIFO takes its trial list's order, which a restore rebuilds from
    a dict in the saved state and re-sorts by last result: a resumed grid would jump to later
    seeds and to the competitors while the first seed's trials wait, and a grid cut off
    again would hold no whole seed.

    A warm-started trial (WARM_FROM in its point: sweeps.core.warm_sources) is held from its
    addition until the trial it starts from has ended: Tune starts every pending trial that
    fits, whatever the scheduler prefers."""

    def on_trial_add(self, tune_controller, trial: Trial) -> None:
        super().on_trial_add(tune_controller, trial)
        if trial.status == Trial.PENDING and not source_ended(
                trial, ray_private.controller_trials(tune_controller)):
            ray_private.hold_trial(trial)

    def choose_trial_to_run(self, tune_controller) -> Trial | None:
        trials = ray_private.controller_trials(tune_controller)
        for status in (Trial.PENDING, Trial.PAUSED):
            waiting = [t for t in trials if t.status == status and source_ended(t, trials)]
            if waiting:
                return min(waiting, key=grid_position)
        return None


def source_ended(trial: Trial, trials: list[Trial]) -> bool:
    """Whether the trial a warm-started `trial` starts from has ended (finished, or failed:
    the warm start then fails, saying why); True for any other trial."""
    source = (trial.config.get(POINT_KEY) or {}).get(WARM_FROM)
    if source is None:
        return True
    for other in trials:
        if grid_position(other.trial_id)[0] == source:
            return other.status in (Trial.TERMINATED, Trial.ERROR)
    return True
