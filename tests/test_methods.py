"""The method registry (DomainBed style): every method behind one interface."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from tests.conftest import SMALL_NET_CONFIG
from tests.fixtures.record_mi_backprop import CASES, recording_path, run
from unbiased.methods import ERM, METHODS, TrainConfig, make_method, method_config
from unbiased.methods.hsic import hsic

FIXTURES = Path(__file__).parent / "fixtures"


def _mismatches(before: dict, after: dict, epochs: int | None = None, rel: float = 1e-6,
                abs_: float = 1e-9, keys: tuple[str, ...] | None = None
                ) -> list[tuple[str, int, str]]:
    return [(case, epoch, key) for case, rows in before.items()
            for epoch, (old, new) in enumerate(zip(rows, after[case], strict=True), 1)
            if epochs is None or epoch <= epochs
            for key, value in old.items() if keys is None or key in keys
            if new[key] != pytest.approx(value, rel=rel, abs=abs_)]


@pytest.mark.slow
def test_mi_backprop_matches_its_recorded_metrics():
    # Recorded per kind of CPU (tests/fixtures/record_mi_backprop.py says why). On a CPU with
    # a recording every metric of every epoch must match; on another, the first epoch's loss
    # and MI must match every recording to within the kernels' differences measured between
    # two CPUs (8e-4 relative), which a change to the algorithm or its draws would exceed.
    after = run(lambda bench, values, seed: make_method("mi_backprop", bench, values, seed))
    assert set(after) == set(CASES)
    own = recording_path()
    recordings = sorted(FIXTURES.glob("mi_backprop_metrics_*.json"))
    assert recordings
    if own.exists():
        assert not _mismatches(json.loads(own.read_text()), after), own.name
        return
    for path in recordings:
        bad = _mismatches(json.loads(path.read_text()), after, epochs=1, rel=5e-3,
                          abs_=1e-3, keys=("loss_task", "mi_batch"))
        assert not bad, (path.name, bad)


def _tiny_bench(grey_digits, n_train=256, n_test=128, width=64):
    from unbiased.benchmarks.digits.data import GreyDigits, build

    d = grey_digits
    digits = GreyDigits(d.train_x[:n_train], d.train_y[:n_train], d.test_x[:n_test],
                        d.test_y[:n_test], "mnist5k")
    return build(digits, 0.02, seed=0, width=width)


VALUES = {"batch_size": 64, "lr": 1e-3, "mine_lr": 1e-3, "K": 2, "inner_z": "batch"}


def _weights(algo: ERM) -> list[torch.Tensor]:
    return [p.detach().clone() for p in [*algo.g.parameters(), *algo.f.parameters()]]


@pytest.mark.parametrize("method", list(METHODS))
def test_lam_zero_is_plain_erm_and_lam_one_is_not(method, grey_digits):
    torch.set_num_threads(1)
    bench = _tiny_bench(grey_digits)
    erm = ERM(bench, TrainConfig(lam=0.0, batch_size=VALUES["batch_size"], lr=VALUES["lr"]),
              seed=3)
    erm.run_epoch()
    zero = make_method(method, bench, {**VALUES, "lam": 0.0}, seed=3)
    zero.run_epoch()
    one = make_method(method, bench, {**VALUES, "lam": 1.0}, seed=3)
    one.run_epoch()
    for a, b in zip(_weights(erm), _weights(zero), strict=True):
        assert torch.equal(a, b)
    assert any(not torch.equal(a, b) for a, b in zip(_weights(erm), _weights(one),
                                                       strict=True))


@pytest.mark.slow
def test_lam_zero_is_the_same_erm_under_every_method_and_K(grey_digits):
    # Each method draws from generators of its own: at lam = 0, g and f see the
    # same batches in the same order as plain ERM, epoch after epoch, evaluation included.
    torch.set_num_threads(1)
    bench = _tiny_bench(grey_digits, width=SMALL_NET_CONFIG["width"])  # equality, not learning
    hosts = {"erm": None, "mi_backprop K=2": ("mi_backprop", {"K": 2}),
             "mi_backprop K=5 fresh": ("mi_backprop", {"K": 5, "inner_z": "fresh"}),
             "mi_backprop K=3 bank pool": ("mi_backprop", {"K": 3, "inner_z": "bank",
                                                           "bank_size": 64}),
             "hsic": ("hsic", {}), "grad_reversal": ("grad_reversal", {}),
             "confusion": ("confusion", {}), "lntl mu=0.5": ("lntl", {"mu": 0.5}),
             "group_reweight": ("group_reweight", {}),
             "group_dro step=0.1": ("group_dro", {"dro_step": 0.1})}
    runs = {}
    for name, host in hosts.items():
        if host is None:
            algo = ERM(bench, TrainConfig(lam=0.0, batch_size=VALUES["batch_size"],
                                          lr=VALUES["lr"]), seed=5)
        else:
            algo = make_method(host[0], bench, {**VALUES, **host[1], "lam": 0.0}, seed=5)
        epochs = []
        for _ in range(3):
            stats = algo.run_epoch()
            metrics = algo.evaluate()
            epochs.append((stats.loss_task, metrics["train_acc"], metrics["test_acc"]))
        runs[name] = (epochs, _weights(algo))
    for name, (epochs, weights) in runs.items():
        assert epochs == runs["erm"][0], name
        assert all(torch.equal(a, b) for a, b in zip(weights, runs["erm"][1], strict=True))


@pytest.mark.parametrize("method", list(METHODS))
def test_resume_from_state_dict_continues_exactly(method, grey_digits):
    torch.set_num_threads(1)
    bench = _tiny_bench(grey_digits)
    straight = make_method(method, bench, {**VALUES, "lam": 1.0}, seed=1)
    straight.run_epoch()
    state = straight.state_dict()
    straight.run_epoch()
    resumed = make_method(method, bench, {**VALUES, "lam": 1.0}, seed=99)
    resumed.load_state_dict(state)
    resumed.run_epoch()
    assert resumed.epoch == straight.epoch == 2
    for a, b in zip(_weights(straight), _weights(resumed), strict=True):
        assert torch.equal(a, b)
    assert state["method"] == method


def test_bias_targets_of_each_benchmark_layout():
    from unbiased.benchmarks.digits.data import C_BINS, colour_attribute
    from unbiased.data import bias_targets

    colours = torch.tensor([[0.0, 0.5, 0.99], [0.2, 0.9, 0.1]])
    targets = bias_targets(colour_attribute(colours), (C_BINS,) * 3)  # one-hot blocks
    assert targets.tolist() == [[0, 4, 7], [1, 7, 0]]
    young = torch.tensor([[1.0], [0.0], [1.0]])  # German: one column, the class index
    assert bias_targets(young, (2,)).tolist() == [[1], [0], [1]]
    with pytest.raises(ValueError, match="columns"):
        bias_targets(torch.zeros(2, 5), (2,))


def test_hsic_is_near_zero_for_independent_and_positive_for_dependent_z():
    gen = torch.Generator().manual_seed(0)
    c = torch.nn.functional.one_hot(torch.randint(4, (512,), generator=gen), 4).float()
    independent = torch.randn(512, 8, generator=gen)
    dependent = independent + 3 * c @ torch.randn(4, 8, generator=gen)
    low, high = hsic(independent, c), hsic(dependent, c)
    assert float(low) < 0.002 < float(high)


def test_hsic_with_the_median_bandwidth_gives_no_gradient_to_shrink_z():
    # With the median detached, the gradient pointed along -z and z shrank to a point
    # (lam >= 1 trained at chance); the median in the graph makes HSIC scale-free, so the
    # gradient has no component along z. A fixed bandwidth keeps that radial pull.
    gen = torch.Generator().manual_seed(0)
    c = torch.nn.functional.one_hot(torch.randint(4, (256,), generator=gen), 4).float()
    base = torch.randn(256, 8, generator=gen) + 2 * c @ torch.randn(4, 8, generator=gen)
    for bandwidth, scale_free in ((None, True), (1.0, False)):
        z = base.clone().requires_grad_(True)
        (grad,) = torch.autograd.grad(hsic(z, c, bandwidth), z)
        radial = float((grad * base).sum()) / float(grad.norm() * base.norm())
        assert (abs(radial) < 1e-4) == scale_free, (bandwidth, radial)
    assert torch.allclose(hsic(3 * base, c), hsic(base, c), rtol=1e-4)


def test_gradient_reversal_sends_minus_lam_times_the_head_gradient():
    from unbiased.methods.grad_reversal import reverse_gradient

    z = torch.randn(5, 3, requires_grad=True)
    (reverse_gradient(z, 0.7) * torch.arange(3.0)).sum().backward()
    assert torch.allclose(z.grad, -0.7 * torch.arange(3.0).expand(5, 3))


def test_mi_lr_sets_the_separate_mi_step_and_defaults_to_lr_times_lam(grey_digits):
    torch.set_num_threads(1)
    bench = _tiny_bench(grey_digits)
    base = {**VALUES, "K": 2, "theta_update": "separate", "lam": 0.5}
    runs = {}
    for name, extra in (("default", {}), ("same", {"mi_lr": base["lr"] * 0.5}),
                        ("slower", {"mi_lr": base["lr"] * 0.05})):
        algo = make_method("mi_backprop", bench, {**base, **extra}, seed=2)
        runs[name] = algo
        algo.run_epoch()
    assert runs["default"].mi_opt.param_groups[0]["lr"] == pytest.approx(base["lr"] * 0.5)
    assert runs["slower"].mi_opt.param_groups[0]["lr"] == pytest.approx(base["lr"] * 0.05)
    default, same, slower = (_weights(a) for a in runs.values())
    assert all(torch.equal(a, b) for a, b in zip(default, same, strict=True))
    assert any(not torch.equal(a, b) for a, b in zip(default, slower, strict=True))
    with pytest.raises(ValueError, match="mi_lr must be > 0"):
        method_config("mi_backprop", {"mi_lr": 0.0})


def test_cosine_schedule_decays_g_and_f_to_zero_keeps_the_critic_and_resumes_exactly(
        grey_digits):
    torch.set_num_threads(1)
    bench = _tiny_bench(grey_digits)  # 256 rows, batch 64: 4 steps an epoch
    base = {**VALUES, "lam": 0.5, "theta_update": "separate", "epochs": 2}
    cosine = make_method("mi_backprop", bench, {**base, "lr_schedule": "cosine"}, seed=3)
    constant = make_method("mi_backprop", bench, base, seed=3)
    cosine.run_epoch()
    state = cosine.state_dict()
    # The first epoch's last step ran at factor (1 + cos(pi * 3/8)) / 2.
    halfway = 0.5 * (1 + math.cos(math.pi * 3 / 8))
    assert cosine.model_opt.param_groups[0]["lr"] == pytest.approx(VALUES["lr"] * halfway)
    cosine.run_epoch()
    last = 0.5 * (1 + math.cos(math.pi * 7 / 8))  # ~0.038: the 8th of 8 steps
    assert cosine.model_opt.param_groups[0]["lr"] == pytest.approx(VALUES["lr"] * last)
    assert cosine.mi_opt.param_groups[0]["lr"] == pytest.approx(VALUES["lr"] * 0.5 * last)
    assert cosine.mine_opt.param_groups[0]["lr"] == VALUES["mine_lr"]  # the critic keeps it
    constant.run_epoch()
    constant.run_epoch()
    assert constant.model_opt.param_groups[0]["lr"] == VALUES["lr"]
    assert any(not torch.equal(a, b) for a, b in zip(_weights(cosine), _weights(constant),
                                                       strict=True))
    resumed = make_method("mi_backprop", bench, {**base, "lr_schedule": "cosine"}, seed=9)
    resumed.load_state_dict(state)
    resumed.run_epoch()
    assert all(torch.equal(a, b) for a, b in zip(_weights(cosine), _weights(resumed),
                                                  strict=True))
    with pytest.raises(ValueError, match="lr_schedule must be one of"):
        method_config("lntl", {"lr_schedule": "linear", "epochs": 2})
    with pytest.raises(ValueError, match="needs the trial's epochs"):
        method_config("hsic", {"lr_schedule": "cosine"})


def test_lntl_entropy_term_is_lowest_for_a_uniform_head():
    from unbiased.methods.lntl import negative_entropy

    uniform = [torch.zeros(4, 8), torch.zeros(4, 8)]
    peaked = [torch.tensor([[5.0] + [0.0] * 7] * 4)] * 2
    assert torch.isclose(negative_entropy(uniform), -torch.log(torch.tensor(8.0)))
    assert float(negative_entropy(peaked)) > float(negative_entropy(uniform)) + 1


def test_lntl_heads_are_one_per_colour_channel_and_each_weight_moves_g(grey_digits):
    # The entropy term (lam) and the reversed head loss (mu) each change g's training; the
    # heads read c as three 8-way targets (Kim et al.'s per-channel predictors).
    torch.set_num_threads(1)
    bench = _tiny_bench(grey_digits)
    runs = {}
    for lam, mu in ((1.0, 0.0), (1.0, 0.5), (1e-9, 0.5)):
        algo = make_method("lntl", bench, {**VALUES, "lam": lam, "mu": mu}, seed=4)
        stats = algo.run_epoch()
        runs[(lam, mu)] = _weights(algo)
    assert [h.classes for h in algo.head] == [(8,)] * 3
    assert -torch.log(torch.tensor(8.0)) <= stats.penalty < 0
    a, b, c = runs.values()
    assert any(not torch.equal(x, y) for x, y in zip(a, b, strict=True))  # mu matters
    assert any(not torch.equal(x, y) for x, y in zip(b, c, strict=True))  # lam matters
    with pytest.raises(ValueError, match="mu must be >= 0"):
        method_config("lntl", {"mu": -0.1})


def test_unknown_method_and_bad_settings_are_named():
    with pytest.raises(ValueError, match="unknown method 'ermm'"):
        method_config("ermm", {})
    with pytest.raises(ValueError, match="head_hidden must be >= 0"):
        method_config("confusion", {"head_hidden": -1})
    with pytest.raises(ValueError, match="hsic_bandwidth"):
        method_config("hsic", {"hsic_bandwidth": 0.0})


@pytest.mark.parametrize("method", list(METHODS))
def test_each_method_trains_as_a_trial_reports_every_metric_and_resumes(method, tiny_digits):
    from tests.trials import run_recorded

    config = {"method": method, "sigma": 0.02, "lam": 1.0, "K": 2, "seed": 0, "epochs": 2,
              "batch_size": 64, "lr": 1e-3, "mine_lr": 1e-3, "inner_z": "batch",
              "device": "cpu", "num_threads": 1, "mi_eval_steps": 20, "fail_once_at_epoch": 2}
    result = run_recorded("digits", config, max_failures=1, digits=tiny_digits)
    assert result.error is None
    df = result.reports.sort_values("epoch")
    assert list(df["epoch"]) == [1, 2]
    assert list(df["start_epoch"]) == [1, 2]  # the restarted attempt began at epoch 2
    for col in ("train_acc", "test_acc", "loss_task", "penalty", "time_s"):
        assert df[col].map(math.isfinite).all(), col
    assert df["train_acc"].between(0, 1).all() and df["time_s"].gt(0).all()
    last = df.iloc[-1]
    assert math.isfinite(last["mi_eval"]) and math.isfinite(last["mi_eval_cond"])
    has_mi = METHODS[method].has_mi_estimator
    assert df["mi"].map(math.isfinite).all() == has_mi
