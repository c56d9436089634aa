"""The digits trial in-process (tests/trials.py: run_trial through a recording session, no
Ray): per-epoch reports, checkpoints, a restart, the stopping rule's pick. The same under Tune
after a SIGKILL, a stop, a diverged trial and a device error: test_reliability.py,
test_group_signal.py, test_devices.py."""

from __future__ import annotations

import math

import pytest

from tests.trials import RecordedTrial, run_recorded


def _config(**over):
    config = {"sigma": 0.02, "lam": 1.0, "K": 2, "seed": 0, "epochs": 2, "batch_size": 64,
              "lr": 1e-3, "mine_lr": 1e-3, "inner_z": "batch", "device": "cpu",
              "num_threads": 1, "mi_eval_steps": 20}
    config.update(over)
    return config


def _fit(digits, config, max_failures=0) -> RecordedTrial:
    return run_recorded("digits", config, max_failures=max_failures, digits=digits)


@pytest.fixture(scope="module")
def default_trial(tiny_digits):
    """A two-epoch trial with the defaults, read by two tests."""
    return _fit(tiny_digits, _config())


@pytest.fixture(scope="module")
def lowest_mi_trial_without_lam(tiny_digits):
    """A three-epoch trial stopped by lowest_mi, with no lam in its config (the method's
    default, 1.0, as `_config`'s): read by two tests."""
    config = _config(epochs=3, select_epoch="lowest_mi")
    del config["lam"]
    return _fit(tiny_digits, config)


REPORTED = ["epoch", "mi", "train_acc", "test_acc", "loss_task", "time_s", "mi_eval", "machine"]


def test_two_epoch_trial_reports_twice_with_checkpoint(default_trial):
    result = default_trial
    assert result.error is None
    df = result.reports
    assert list(df["epoch"]) == [1, 2]
    for col in REPORTED:
        assert col in df.columns, col
    assert df["train_acc"].between(0, 1).all() and df["test_acc"].between(0, 1).all()
    assert df["time_s"].gt(0).all()
    # the epoch's wall seconds hold its parts: training steps, evaluation, mi_eval, checkpoint
    parts = df["time_s"] + df["eval_s"] + df["mi_eval_s"] + df["ckpt_s"]
    assert (parts <= df["epoch_s"] + 1e-6).all()
    assert df["eval_s"].gt(0).all() and df["ckpt_s"].gt(0).all()
    assert df["mi_eval_s"].iloc[0] == 0 and df["mi_eval_s"].iloc[1] > 0  # last epoch only
    # mi_eval only at the end of the trial
    assert math.isnan(df["mi_eval"].iloc[0]) and math.isfinite(df["mi_eval"].iloc[1])
    assert result.checkpoint is not None and result.state["epoch"] == 2
    from unbiased.trial import machine_id

    assert set(df["machine"]) == {machine_id()} and machine_id()


def test_crashed_trial_resumes_from_its_epoch_1_checkpoint(tiny_digits):
    # The first attempt raises at epoch 2 after reporting epoch 1 with a checkpoint; it is
    # restarted (as Tune's max_failures does), and must start at epoch 2, not from scratch.
    result = _fit(tiny_digits, _config(fail_once_at_epoch=2), max_failures=1)
    assert result.error is None
    df = result.reports
    assert sorted(df["epoch"]) == [1, 2]  # every epoch exactly once
    epoch2 = df[df["epoch"] == 2].iloc[0]
    assert epoch2["start_epoch"] == 2  # the second attempt started from the checkpoint
    assert df[df["epoch"] == 1].iloc[0]["start_epoch"] == 1


def test_without_restarts_the_injected_failure_is_an_error(tiny_digits):
    result = _fit(tiny_digits, _config(fail_once_at_epoch=1, epochs=1))
    assert result.error is not None
    assert "injected failure at epoch 1" in str(result.error)



@pytest.mark.parametrize("rule", ["lowest_mi", "lowest_mi_cond"])
def test_lowest_mi_stopping_marks_one_epoch_with_its_own_mi_eval(rule, tiny_digits, request):
    import torch

    from sweeps.results_frame import selected_rows
    from unbiased.stopping import CRITERION, EstimatedEpoch, pick_epoch

    if rule == "lowest_mi":
        result = request.getfixturevalue("lowest_mi_trial_without_lam")
    else:
        result = _fit(tiny_digits, _config(epochs=3, select_epoch=rule))
    assert result.error is None
    df = result.reports
    # mi_eval (and its label-conditional twin) every epoch, so every epoch is a candidate,
    # with the same estimators' floors on the model's own predictions
    for col in ("mi_eval", "mi_eval_cond", "mi_floor", "mi_floor_cond"):
        assert df[col].notna().all(), col
    chosen = int(df["selected_epoch"].dropna().iloc[-1])
    records = [EstimatedEpoch(int(r.epoch), float(r.train_acc), float(r.mi_eval),
                           float(r.mi_eval_cond), float(r.mi_floor), float(r.mi_floor_cond))
               for r in df.itertuples()]
    assert chosen == (pick_epoch(records, criterion=CRITERION[rule]) or 3)
    # the chosen epoch's estimates again, with another seed: not the minimum it was chosen by
    last = df[df["epoch"] == 3].iloc[0]
    at_choice = df[df["epoch"] == chosen].iloc[0]
    for col in ("mi_eval", "mi_eval_cond"):
        again = float(last[f"selected_{col}"])
        assert math.isfinite(again) and again != float(at_choice[col])
    df = df.assign(trial_id="t")
    marked = selected_rows(df)
    assert marked.sum() == 1 and int(df.loc[marked, "epoch"].iloc[0]) == chosen
    # the final checkpoint holds the chosen epoch's weights
    state = result.state
    assert state["selected"]["epoch"] == chosen
    assert set(state["selected"]) == {"epoch", "g", "f"}
    if chosen == 3:
        for k, v in state["g"].items():
            assert torch.equal(v, state["selected"]["g"][k])


def test_last_epoch_is_selected_by_default(default_trial):
    from sweeps.results_frame import selected_rows

    df = default_trial.reports.assign(trial_id="t")
    assert selected_rows(df).tolist() == [False, True]


def test_a_trial_without_lam_takes_the_methods_default_everywhere(lowest_mi_trial_without_lam):
    # One default for lam (TrainConfig's 1.0): the method trains with it and the trial does
    # not take the missing lam for an ERM baseline (which would switch off lowest_mi).
    from unbiased.methods import TrainConfig

    assert TrainConfig().lam > 0
    result = lowest_mi_trial_without_lam
    assert result.error is None
    df = result.reports
    assert df["mi_eval"].notna().all()  # measured every epoch: the stopping rule is on


def test_mi_eval_every_estimates_every_nth_epoch_and_survives_a_restart(tiny_digits):
    # Estimates at epochs 2 and 4 (every 2, and the last); the attempt that fails at epoch 4
    # restarts from epoch 3's checkpoint, written without an estimate: it must still hold
    # epoch 2's record and weights for the rule to pick among 2 and 4.
    config = _config(epochs=4, select_epoch="lowest_mi_cond", mi_eval_every=2,
                     fail_once_at_epoch=4)
    result = _fit(tiny_digits, config, max_failures=1)
    assert result.error is None
    df = result.reports.drop_duplicates("epoch", keep="last").set_index("epoch")
    assert sorted(df.index) == [1, 2, 3, 4] and df.loc[4, "start_epoch"] == 4
    estimated = [e for e in df.index if math.isfinite(df.loc[e, "mi_eval_cond"])]
    assert estimated == [2, 4]
    assert df.loc[1, "mi_eval_s"] == 0 and df.loc[3, "mi_eval_s"] == 0
    assert df.loc[4, "selected_epoch"] in (2, 4)
    assert math.isfinite(df.loc[4, "selected_mi_eval_cond"])
    state = result.state
    assert [r["epoch"] for r in state["records"]] == [2, 4]  # epoch 2's across the restart
