"""The trial loop driven in-process by a MemorySession (unbiased/trial.py), no Ray:
every epoch reported once with a checkpoint, an exact restart, a diverged trial, a device
error; and a trial bundle (`run_bundle`) through the same session."""

from __future__ import annotations

import math

import pytest
import torch

from unbiased.benchmarks.digits.spec import build as build_digits
from unbiased.trial import (
    MEMBERS_KEY,
    InjectedFailure,
    MemorySession,
    read_checkpoint,
    run_bundle,
    run_trial,
)

# Seconds and where a run happened differ between two runs of the same trial.
CLOCK = {"time_s", "epoch_s", "eval_s", "mi_eval_s", "ckpt_s", "start_epoch", "node",
         "node_id", "machine"}


def _config(**over) -> dict:
    config = {"sigma": 0.02, "lam": 1.0, "K": 2, "seed": 0, "epochs": 3, "batch_size": 64,
              "lr": 1e-3, "mine_lr": 1e-3, "inner_z": "batch", "device": "cpu", "width": 8,
              "num_threads": 1, "mi_eval_steps": 20, "mine_standardize": True,
              "mi_guard": True, "mine_ema_rate": 0.01, "select_epoch": "lowest_mi_cond"}
    config.update(over)
    return config


@pytest.fixture
def build(tiny_digits):
    def build(config: dict):
        bench = build_digits(config, digits=tiny_digits)
        if config.get("nan_inputs"):  # a trial whose loss is NaN from its first step
            bench.train.x.fill_(float("nan"))
        return bench
    return build


def _same(a: dict, b: dict, keys=None) -> None:
    for key in keys or (set(a) | set(b)) - CLOCK:
        va, vb = a.get(key), b.get(key)
        if isinstance(va, float) and math.isnan(va):
            assert isinstance(vb, float) and math.isnan(vb), key
        else:
            assert va == vb, (key, va, vb)


def test_every_epoch_is_reported_once_with_a_checkpoint(build):
    session = MemorySession()
    run_trial(_config(), build, session)
    assert [r["epoch"] for r in session.reports] == [1, 2, 3]
    assert session.checkpoints == 3
    last = session.reports[-1]
    assert 1 <= last["selected_epoch"] <= 3 and math.isfinite(last["mi_eval_cond"])
    assert all(math.isfinite(r["mi_eval"]) for r in session.reports)  # every epoch: the rule
    state = read_checkpoint(session.checkpoint)[""]
    assert state["epoch"] == 3 and state["selected"]["epoch"] == last["selected_epoch"]


def test_a_restarted_trial_continues_exactly(build):
    straight = MemorySession()
    run_trial(_config(), build, straight)
    first = MemorySession()
    with pytest.raises(InjectedFailure):
        run_trial(_config(fail_once_at_epoch=2), build, first)
    assert [r["epoch"] for r in first.reports] == [1]
    again = MemorySession(checkpoint=first.checkpoint)
    run_trial(_config(fail_once_at_epoch=2), build, again)
    assert [r["epoch"] for r in again.reports] == [2, 3]
    assert again.reports[0]["start_epoch"] == 2
    for a, b in zip(straight.reports[1:], again.reports, strict=True):
        _same(a, b)


def test_a_diverged_trial_reports_why_once_and_keeps_no_checkpoint(build):
    session = MemorySession()
    run_trial(_config(nan_inputs=True), build, session)
    assert len(session.reports) == 1 and session.checkpoint is None
    assert session.reports[0]["diverged"].startswith("diverged at epoch 1")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_device_error_is_reported_once_and_trains_nothing(build):
    session = MemorySession(gpus=[0])
    run_trial(_config(device="auto"), build, session)
    assert len(session.reports) == 1 and session.checkpoint is None
    assert "GPUs [0] from Ray" in session.reports[0]["device_error"]


def test_a_trial_computes_with_subnormals_flushed_to_zero(build):
    # Subnormal weights made late epochs many times slower on CPU (bench/subnormals.py).
    torch.set_flush_denormal(False)
    tiny = torch.tensor([1e-39])
    assert (tiny * 1.0).item() != 0.0  # kept by default: the check below could fail
    try:
        run_trial(_config(epochs=1, lam=0.0), build, MemorySession())
        assert (tiny * 1.0).item() == 0.0
    finally:
        torch.set_flush_denormal(False)


# -- bundles -------------------------------------------------------------------------------
POINTS = [{"lam": 0.0, "seed": 0}, {"lam": 0.5, "seed": 1}, {"lam": 1.0, "seed": 0}]


def _bundle_config(points=POINTS, **over) -> dict:
    config = _config(**over)
    for key in ("lam", "seed"):
        config.pop(key)
    return {**config, MEMBERS_KEY: points}


def _member_reports(session: MemorySession, key: str) -> list[dict]:
    prefix = f"{key}/"
    return [{k[len(prefix):]: v for k, v in r.items() if k.startswith(prefix)}
            for r in session.reports if f"{prefix}epoch" in r]


def test_a_bundle_reports_every_member_every_epoch_as_its_trial_would(build):
    bundled = MemorySession()
    run_bundle(_bundle_config(), build, bundled)
    assert [r["epoch"] for r in bundled.reports] == [1, 2, 3]
    states = read_checkpoint(bundled.checkpoint)
    assert sorted(states) == ["m0", "m1", "m2"]
    for i, point in enumerate(POINTS):
        alone = MemorySession()
        run_trial(_config(**point), build, alone)
        member = _member_reports(bundled, f"m{i}")
        assert [r["epoch"] for r in member] == [1, 2, 3]
        assert set(member[-1]) - {"ckpt_s", "epoch_s"} == set(alone.reports[-1]) - {
            "ckpt_s", "epoch_s"}
        assert states[f"m{i}"]["epoch"] == 3 and states[f"m{i}"]["seed"] == point["seed"]
        if point["lam"] == 0:
            # ERM: nothing of T reaches g and f, so the vectorised run is the same model
            for a, b in zip(alone.reports, member, strict=True):
                for key in ("train_acc", "test_acc", "loss_task"):
                    assert math.isclose(a[key], b[key], abs_tol=1e-6), key
            assert member[-1]["selected_epoch"] == 3  # ERM reports its last epoch


def test_a_restarted_bundle_continues_exactly(build):
    straight = MemorySession()
    run_bundle(_bundle_config(), build, straight)
    first = MemorySession()
    with pytest.raises(InjectedFailure):
        run_bundle(_bundle_config(fail_once_at_epoch=2), build, first)
    again = MemorySession(checkpoint=first.checkpoint)
    run_bundle(_bundle_config(fail_once_at_epoch=2), build, again)
    assert [r["epoch"] for r in again.reports] == [2, 3]
    for key in ("m0", "m1", "m2"):
        for a, b in zip(_member_reports(straight, key)[1:], _member_reports(again, key),
                        strict=True):
            _same(a, b)


def test_a_diverged_member_is_reported_once_and_frozen_the_others_go_on(build):
    points = [{"lam": 0.0, "seed": 0}, {"lam": 1.0, "seed": 0, "nan_inputs": True},
              {"lam": 1.0, "seed": 1}]
    first = MemorySession()
    run_bundle(_bundle_config(points, epochs=2), build, first)
    diverged = _member_reports(first, "m1")
    assert len(diverged) == 1 and diverged[0]["diverged"].startswith("diverged at epoch 1")
    for key in ("m0", "m2"):
        assert [r["epoch"] for r in _member_reports(first, key)] == [1, 2]
        assert all(math.isfinite(r["train_acc"]) for r in _member_reports(first, key))
    states = read_checkpoint(first.checkpoint)
    assert states["m1"] == {"diverged": diverged[0]["diverged"], "epoch": 2}
    # Continued for a third epoch from that checkpoint: the diverged member stays out.
    more = MemorySession(checkpoint=first.checkpoint)
    run_bundle(_bundle_config(points, epochs=3), build, more)
    assert [r["epoch"] for r in more.reports] == [3]
    assert _member_reports(more, "m1") == [] and len(_member_reports(more, "m2")) == 1


def test_every_epoch_says_its_precision_and_tf32_with_deterministic_is_refused(build):
    # On a CPU: fp32, or bf16-g with --amp (--tf32 changes nothing there: GPU matmuls);
    # a bundle's members say theirs.
    plain, amp = MemorySession(), MemorySession()
    run_trial(_config(epochs=1, tf32=True), build, plain)
    run_trial(_config(epochs=1, amp=True), build, amp)
    assert [r["precision"] for r in plain.reports] == ["fp32"]
    assert [r["precision"] for r in amp.reports] == ["bf16-g"]
    bundled = MemorySession()
    run_bundle(_bundle_config(epochs=1, amp=True), build, bundled)
    for i in range(len(POINTS)):
        assert [r["precision"] for r in _member_reports(bundled, f"m{i}")] == ["bf16-g"]
    with pytest.raises(ValueError, match="--tf32.*--deterministic"):
        run_trial(_config(tf32=True, deterministic=True), build, MemorySession())
