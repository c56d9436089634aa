"""A trial run in the test's own process, as Tune runs it but without Ray: `run_recorded`
drives `run_trial` (unbiased/trial.py) through a `MemorySession`, and restarts it from
its last checkpoint when it raises, as Tune does with `max_failures`. Each checkpoint goes
through the same bytes as under Tune (`checkpoint_files`), so a restart here reads
what a restart under Tune reads."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from unbiased.benchmarks import benchmark_spec
from unbiased.trial import MemorySession, read_checkpoint, run_trial


@dataclass
class RecordedTrial:
    reports: pd.DataFrame  # every report of every attempt, in order (Tune's metrics_dataframe)
    checkpoint: dict[str, bytes] | None  # the last checkpoint's files
    error: BaseException | None  # what ended the last attempt, if it raised

    @property
    def state(self) -> dict:
        """The last checkpoint's state of a plain trial (one member)."""
        assert self.checkpoint is not None, "the trial kept no checkpoint"
        return read_checkpoint(self.checkpoint)[""]


def run_recorded(benchmark: str, config: dict, max_failures: int = 0,
                 **loaded: object) -> RecordedTrial:
    """Train one trial of a registered benchmark on `loaded` data (what its driver ships
    to a trial), restarting it up to `max_failures` times from its last checkpoint."""
    spec = benchmark_spec(benchmark)
    reports: list[dict] = []
    checkpoint = None
    for _ in range(max_failures + 1):
        session = MemorySession(checkpoint=checkpoint)
        try:
            run_trial(dict(config), lambda cfg: spec.build(cfg, **loaded), session)
            error = None
        except Exception as exc:  # noqa: BLE001 - the trial's error, as Tune records it
            error = exc
        reports += session.reports
        checkpoint = session.checkpoint
        if error is None:
            break
    return RecordedTrial(pd.DataFrame(reports), checkpoint, error)
