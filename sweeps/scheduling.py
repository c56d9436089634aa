"""The order in which a grid's trials start (Ray imported here, not by the drivers' `--help`)."""

from __future__ import annotations

from ray.tune.experiment import Trial
from ray.tune.schedulers import FIFOScheduler

from sweeps import ray_private


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
    again would hold no whole seed."""

    def choose_trial_to_run(self, tune_controller) -> Trial | None:
        for status in (Trial.PENDING, Trial.PAUSED):
            waiting = [t for t in ray_private.controller_trials(tune_controller)
                       if t.status == status]
            if waiting:
                return min(waiting, key=grid_position)
        return None
