"""Algorithm 1: ERM at lam = 0, the gradient rescaling, exact resume, MI falling with lam."""

from __future__ import annotations

import math

import pytest
import torch

from unbiased.data import Benchmark, TensorSplit
from unbiased.methods.mi_backprop import MIBackprop, MIBackpropConfig, rescaled_mi_grads
from unbiased.mine import mi_eval
from unbiased.models import MLPFeatures


def biased_tabular(n: int = 2000, seed: int = 0, agree: float = 0.95,
                   c_noise: float = 0.05, z_dim: int = 16) -> Benchmark:
    """y is visible in x[0] (noisy), the binary bias c in x[1] (clean); in training c agrees
    with y 95% of the time, so a model can lean on c. z can drop c and still fit y."""
    gen = torch.Generator().manual_seed(seed)

    def split(m: int, agree_rate: float) -> TensorSplit:
        y = torch.randint(2, (m,), generator=gen)
        flip = torch.rand(m, generator=gen) > agree_rate
        c = torch.where(flip, 1 - y, y)
        x = torch.stack([y + 0.6 * torch.randn(m, generator=gen),
                         c + c_noise * torch.randn(m, generator=gen)], dim=1)
        return TensorSplit(x.float(), y, c.float().unsqueeze(1))

    return Benchmark("toy", split(n, agree), {"test_acc": split(n // 2, 0.5)}, 2,
                     lambda: MLPFeatures(2, z_dim), z_dim=z_dim, c_dim=1)


def _params(algo: MIBackprop) -> list[torch.Tensor]:
    return [p.detach().clone() for p in [*algo.g.parameters(), *algo.f.parameters()]]


def test_lam_zero_is_plain_erm_whatever_mine_does():
    bench = biased_tabular()
    runs = []
    for K in (1, 4):
        algo = MIBackprop(bench, MIBackpropConfig(lam=0.0, K=K, batch_size=128, lr=1e-2,
                                                  mine_lr=1e-2, inner_z="batch"), seed=0)
        algo.run_epoch()
        runs.append(_params(algo))
    for a, b in zip(*runs, strict=True):
        assert torch.equal(a, b)


def test_rescaled_mi_gradient_never_exceeds_task_gradient():
    g_task = torch.tensor([3.0, 4.0])  # norm 5
    big_mi, small_mi = torch.tensor([0.0, 100.0]), torch.tensor([0.0, 1.0])
    out = rescaled_mi_grads([g_task, g_task], [big_mi, small_mi])
    assert torch.allclose(out[0], torch.tensor([0.0, 5.0]))  # direction kept, norm 5
    assert torch.allclose(out[1], small_mi)  # smaller than the task's: unchanged


@pytest.mark.parametrize("inner_z", ["fresh", "batch", "bank", "first_k"])
def test_resume_from_state_dict_continues_exactly(inner_z):
    bench = biased_tabular(n=600)
    cfg = MIBackpropConfig(lam=1.0, K=3, batch_size=64, lr=1e-2, mine_lr=1e-2, inner_z=inner_z,
                           mine_ema_rate=0.1)
    straight = MIBackprop(bench, cfg, seed=1)
    straight.run_epoch()
    state = straight.state_dict()
    straight.run_epoch()

    resumed = MIBackprop(bench, cfg, seed=99)  # different init: everything must come from state
    resumed.load_state_dict(state)
    assert resumed.epoch == 1
    resumed.run_epoch()
    for a, b in zip(_params(straight), _params(resumed), strict=True):
        assert torch.equal(a, b)
    assert straight.evaluate() == resumed.evaluate()


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_mi_goes_down_when_lambda_goes_up(seed: int):
    # c independent of y and noisy in x[1]: ERM's 4 ReLU features carry c incidentally;
    # Algorithm 1 with lam = 1 must remove most of it while fitting y as well. Measured over
    # seeds 0-3 (fresh inner z): mi_eval 0.41-0.57 nats at lam 0, -0.00-0.15 at lam 1, a
    # ratio of 0.36 at worst; train acc within 0.01. The assertion asks for a 40% drop at
    # two seeds. (With 16 features the drop is small and seed-dependent, 0.77-1.03: every
    # unit must be scrubbed of c, and the adversary chases one direction at a time.)
    bench = biased_tabular(agree=0.5, c_noise=0.3, z_dim=4)
    mi, acc = {}, {}
    for lam in (0.0, 1.0):
        algo = MIBackprop(bench, MIBackpropConfig(lam=lam, K=10, batch_size=200, lr=1e-2,
                                                  mine_lr=1e-2, inner_z="fresh"), seed=seed)
        for _ in range(30):
            algo.run_epoch()
        acc[lam] = algo.evaluate()["train_acc"]
        mi[lam] = mi_eval(algo.train_features(), bench.train.c, steps=800)
    assert mi[0.0] > 0.2, mi  # ERM's features do carry c: the drop below is not vacuous
    assert mi[1.0] < 0.6 * mi[0.0], mi
    assert acc[1.0] > acc[0.0] - 0.03, acc  # still fits the task


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="lam must be >= 0"):
        MIBackpropConfig(lam=-1).validate()
    with pytest.raises(ValueError, match="K must be >= 1"):
        MIBackpropConfig(K=0).validate()
    with pytest.raises(ValueError, match="inner_z"):
        MIBackpropConfig(inner_z="bank?").validate()
    with pytest.raises(ValueError, match="mine_optimizer"):
        MIBackpropConfig(mine_optimizer="rmsprop").validate()


def test_bank_refreshed_every_step_computes_the_same_mi_as_fresh():
    bench = biased_tabular(n=600)
    runs = {}
    for mode in ("fresh", "bank"):
        cfg = MIBackpropConfig(lam=1.0, K=4, batch_size=64, lr=1e-2, mine_lr=1e-2, inner_z=mode,
                               bank_refresh=1)
        algo = MIBackprop(bench, cfg, seed=0)
        stats = algo.run_epoch()
        runs[mode] = (stats.mi_batch, algo.evaluate()["mi"],
                      [p.detach().clone() for p in algo.mine.parameters()])
    assert runs["bank"][0] == pytest.approx(runs["fresh"][0], abs=1e-5)
    assert runs["bank"][1] == pytest.approx(runs["fresh"][1], abs=1e-5)
    for a, b in zip(runs["bank"][2], runs["fresh"][2], strict=True):
        assert torch.allclose(a, b, atol=1e-5)


def test_stale_bank_differs_from_fresh():
    # With a bank refreshed every 5 outer steps the K steps see stale z: a different run.
    bench = biased_tabular(n=600)
    mis = []
    for mode, refresh in (("fresh", 1), ("bank", 5)):
        cfg = MIBackpropConfig(lam=1.0, K=4, batch_size=64, lr=5e-2, mine_lr=1e-2, inner_z=mode,
                               bank_refresh=refresh)
        algo = MIBackprop(bench, cfg, seed=0)
        mis.append(algo.run_epoch().mi_batch)
    assert mis[0] != pytest.approx(mis[1], abs=1e-6)


@pytest.mark.parametrize("theta_update", ["separate", "joint"])
def test_theta_update_separate_gives_the_mi_gradient_an_adam_of_its_own(theta_update):
    # One outer step (one batch): Adam's first step moves each element by ~lr * sign(grad).
    # separate: task Adam(lr) + MI Adam(lr * lam), so elements where both agree move by
    # ~lr * (1 + lam); joint: one Adam step on the sum moves every element by at most ~lr.
    bench = biased_tabular(n=256)
    lr, lam = 1e-3, 2.0
    cfg = MIBackpropConfig(lam=lam, K=2, batch_size=256, lr=lr, mine_lr=1e-2, inner_z="batch",
                           theta_update=theta_update)
    algo = MIBackprop(bench, cfg, seed=0)
    before = [p.detach().clone() for p in algo.g.parameters()]
    algo.run_epoch()
    moved = max(float((p.detach() - b).abs().max())
                for p, b in zip(algo.g.parameters(), before, strict=True))
    if theta_update == "separate":
        assert algo.mi_opt is not None
        assert moved > 1.5 * lr and moved <= lr * (1 + lam) * 1.001
    else:
        assert algo.mi_opt is None
        assert moved <= lr * 1.001


def test_theta_update_is_validated_and_irrelevant_at_lam_zero():
    with pytest.raises(ValueError, match="theta_update"):
        MIBackpropConfig(theta_update="both").validate()
    bench = biased_tabular(n=300)
    runs = []
    for mode in ("separate", "joint"):
        algo = MIBackprop(bench, MIBackpropConfig(lam=0.0, K=2, batch_size=100, lr=1e-2,
                                                  inner_z="batch", theta_update=mode), seed=0)
        algo.run_epoch()
        runs.append(_params(algo))
    for a, b in zip(*runs, strict=True):
        assert torch.equal(a, b)


@pytest.mark.slow
def test_conditional_mi_eval_sees_colour_beyond_the_label_only():
    # z = one-hot label: it knows c only through y, so I(z; c | y) ~ 0 while the plain bound
    # reads about I(y; c); z = [label, c] carries c beyond y and scores high on both.
    gen = torch.Generator().manual_seed(0)
    n = 4000
    y = torch.randint(4, (n,), generator=gen)
    flip = torch.rand(n, generator=gen) < 0.2
    c_idx = torch.where(flip, torch.randint(4, (n,), generator=gen), y)
    c = torch.nn.functional.one_hot(c_idx, 4).float()
    z_label = torch.nn.functional.one_hot(y, 4).float()
    plain = mi_eval(z_label, c, steps=400, given=None)
    cond = mi_eval(z_label, c, steps=400, given=y)
    both = mi_eval(torch.cat([z_label, c], 1), c, steps=400, given=y)
    assert plain > 0.5 and abs(cond) < 0.05 and both > 0.2


def test_mi_guard_skips_the_mi_step_exactly_when_the_estimate_is_negative():
    # A fresh T reads below 0 (worse than a constant) until it has learnt something; c is
    # clean in x, so after a few batches it reads above 0 (6 of 10 guarded here). The guard
    # must take task-only steps on the first batches and MI steps after, and count them.
    bench = biased_tabular(n=640)
    cfg = dict(lam=1.0, K=1, batch_size=64, lr=1e-2, mine_lr=1e-4, inner_z="batch")
    guarded = MIBackprop(bench, MIBackpropConfig(**cfg, mi_guard=True), seed=0)
    stats = guarded.run_epoch()
    assert 0 < guarded.guarded_steps < guarded.theta_steps == 10
    assert stats.guarded_frac == guarded.guarded_steps / 10
    plain = MIBackprop(bench, MIBackpropConfig(**cfg), seed=0)
    assert math.isnan(plain.run_epoch().guarded_frac)
    for a, b in zip(_params(guarded), _params(plain), strict=True):
        assert not torch.equal(a, b)  # the skipped MI steps changed the run


def test_mi_guard_step_on_a_negative_batch_is_plain_erm():
    # One batch per epoch: when its estimate is negative, the guarded step must move g and f
    # exactly as an ERM step (lam = 0, same seed and data order) does.
    bench = biased_tabular(n=64)
    cfg = MIBackpropConfig(lam=1.0, K=1, batch_size=64, lr=1e-2, mine_lr=1e-12, inner_z="batch",
                           mine_optimizer="sgd", mi_guard=True)
    for seed in range(20):
        algo = MIBackprop(bench, cfg, seed=seed)
        erm = MIBackprop(bench, MIBackpropConfig(lam=0.0, K=1, batch_size=64, lr=1e-2,
                                                 mine_lr=1e-12, inner_z="batch",
                                                 mine_optimizer="sgd"), seed=seed)
        algo.run_epoch()
        erm.run_epoch()
        if algo.guarded_steps == 1:
            for a, b in zip(_params(algo), _params(erm), strict=True):
                assert torch.equal(a, b)
            return
    pytest.fail("no seed in 0-19 gave a negative first estimate")
