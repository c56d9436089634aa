"""What the session gives a trial besides reports and its own checkpoint: another trial's
last checkpoint of the same sweep (what a warm start from a baseline trained before
it reads). In-process with the recording session, and under Tune (TuneSession keeps every
trial's record in the sweep's storage, trainables/record.py)."""

from __future__ import annotations

import pytest

from trainables.record import records_root
from unbiased.settings import RECORDS_KEY
from unbiased.trial import MemorySession, checkpoint_files, read_checkpoint


def test_the_recording_session_gives_the_checkpoints_it_was_given():
    baseline = checkpoint_files({"": {"epoch": 3, "by": "a"}})
    session = MemorySession(others={"a": baseline})
    assert read_checkpoint(session.checkpoint_of("a"))[""] == {"epoch": 3, "by": "a"}
    assert session.checkpoint_of("c") is None


@pytest.mark.ray
def test_under_tune_a_trial_is_its_key_and_reads_another_trials_last_checkpoint(ray_local,
                                                                                tmp_path):
    from ray import tune

    def trial(config: dict) -> None:  # local: Ray's workers cannot import this file
        from trainables.tune_trial import TuneSession

        session = TuneSession(config)
        me = session.key
        if config["point"]["role"] == "baseline":
            for epoch in (1, 2):
                session.report({"epoch": epoch, "me": me, "seen": ""},
                               checkpoint_files({"": {"epoch": epoch, "by": me}}))
            return
        files = session.checkpoint_of("role=baseline")  # the baseline's record
        state = read_checkpoint(files)[""] if files is not None else {}
        session.report({"epoch": 1, "me": me, "seen": f"{state.get('by')}:{state.get('epoch')}",
                        "unknown": session.checkpoint_of("no_such_trial") is None})

    storage = tmp_path / "storage"
    tuner = tune.Tuner(
        tune.with_resources(trial, {"cpu": 2}),  # one at a time on ray_local's 2 CPUs
        param_space={"point": tune.grid_search([{"role": "baseline"}, {"role": "warm"}]),
                     RECORDS_KEY: records_root(str(storage), "session")},
        run_config=tune.RunConfig(name="session", storage_path=str(storage), verbose=0))
    results = {r.config["point"]["role"]: r for r in tuner.fit()}
    baseline, warm = results["baseline"], results["warm"]
    assert baseline.error is None and warm.error is None
    assert baseline.metrics["me"] == "role=baseline" and warm.metrics["me"] == "role=warm"
    assert warm.metrics["seen"] == "role=baseline:2"  # its last checkpoint
    assert warm.metrics["unknown"] is True
    # Tune kept no checkpoint: the records hold them, one a trial
    assert not list(storage.glob("session/*/checkpoint_*"))
    assert [p.name for p in (storage / "session/trials/role=baseline/checkpoint").iterdir()
            ] == ["000002"]
