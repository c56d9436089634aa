"""Trial bundles: B mi_backprop points trained as one, vectorised over members, must follow
each point's run alone (float rounding of the vectorised kernels apart)."""

from __future__ import annotations

import math

import pytest
import torch

from tests.test_train import biased_tabular
from unbiased.methods.bundle import MIBackpropBundle, bundle_problems
from unbiased.methods.mi_backprop import MIBackprop, MIBackpropConfig

CRITIC = dict(K=3, batch_size=64, lr=1e-2, mine_lr=1e-3, inner_z="batch", mine_ema_rate=0.01,
              mine_standardize=True, mi_guard=True)
POINTS = [(0.0, 4), (0.5, 5), (1.0, 6)]  # (lam, seed): lam 0 among them, each its own seed


def _tensors(algo: MIBackprop) -> dict[str, torch.Tensor]:
    """Weights, MINE's average, and every optimiser's moments and steps, by name."""
    out = {f"{name}.{k}": v for name, m in algo.modules().items()
           for k, v in m.state_dict().items()}
    for name in ("model_opt", "mine_opt", "mi_opt"):
        opt = getattr(algo, name)
        if opt is None:
            continue
        for i, p in enumerate(p for group in opt.param_groups for p in group["params"]):
            for k, v in opt.state.get(p, {}).items():
                out[f"{name}.{i}.{k}"] = v
    return out


def _alone_and_bundled(bench, cfg: dict, points=POINTS, epochs: int = 1):
    alone = [MIBackprop(bench, MIBackpropConfig(**cfg, lam=lam), seed=seed) for lam, seed in points]
    stats_alone = [[a.run_epoch() for _ in range(epochs)][-1] for a in alone]
    members = [MIBackprop(bench, MIBackpropConfig(**cfg, lam=lam), seed=seed)
               for lam, seed in points]
    bundle = MIBackpropBundle(members)
    stats_bundle = [bundle.run_epoch() for _ in range(epochs)][-1]
    return alone, stats_alone, members, stats_bundle


@pytest.fixture
def float64():
    """Weights and data in float64. In float32 a gradient that is 0 in exact arithmetic (T's
    output bias under the DV bound, the bias of a z unit that is active on every row under
    mine_standardize) comes out as rounding noise of ~1e-9, and Adam divides it by
    |g| + 1e-8: a step of up to a fifth of lr whose sign is the noise's. A vectorised kernel
    rounds otherwise, so those elements part from the run alone by ~lr (docs/MEASURED.md,
    "Trial bundles"); in float64 the noise is ~1e-18 and moves nothing."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(before)


def _double(bench):
    from dataclasses import replace

    from unbiased.data import TensorSplit

    def cast(split):
        return TensorSplit(split.x.double(), split.y, split.c.double())
    return replace(bench, train=cast(bench.train),
                   eval_splits={k: cast(v) for k, v in bench.eval_splits.items()})


@pytest.mark.parametrize("theta_update", ["separate", "joint"])
@pytest.mark.parametrize("standardize", [True, False])
def test_each_member_follows_its_point_run_alone(theta_update, standardize, float64):
    torch.set_num_threads(1)
    bench = _double(biased_tabular(n=192))  # 3 outer steps an epoch
    alone, stats_alone, members, stats_bundle = _alone_and_bundled(
        bench, {**CRITIC, "theta_update": theta_update, "mine_standardize": standardize})
    for a, m, sa, sb in zip(alone, members, stats_alone, stats_bundle, strict=True):
        ta, tm = _tensors(a), _tensors(m)
        assert ta.keys() <= tm.keys()
        for key, value in ta.items():
            assert value.dtype == tm[key].dtype, key
            assert torch.allclose(value, tm[key], rtol=0, atol=1e-6, equal_nan=True), key
        assert math.isclose(sa.loss_task, sb.loss_task, abs_tol=1e-6)
        assert math.isclose(sa.penalty, sb.penalty, abs_tol=1e-6)
        assert (math.isnan(sa.guarded_frac) and math.isnan(sb.guarded_frac)
                or sa.guarded_frac == sb.guarded_frac)
        assert torch.equal(a.method_gen.get_state(), m.method_gen.get_state())
        assert torch.equal(a.gen.get_state(), m.gen.get_state())
    # The members did train, and differently: lam and seed matter.
    g = [torch.cat([p.flatten() for p in m.g.parameters()]) for m in members]
    assert not torch.allclose(g[1], g[2])


def test_a_bundle_keeps_following_over_epochs_and_its_members_resume_alone(float64):
    # Two epochs in a bundle; then each member's state_dict continues alone for a third
    # epoch as the point run alone for three.
    torch.set_num_threads(1)
    bench = _double(biased_tabular(n=192))
    cfg = {**CRITIC, "theta_update": "separate"}
    alone, _, members, _ = _alone_and_bundled(bench, cfg, epochs=2)
    for a, m, (lam, seed) in zip(alone, members, POINTS, strict=True):
        resumed = MIBackprop(bench, MIBackpropConfig(**cfg, lam=lam), seed=seed)
        resumed.load_state_dict(m.state_dict())
        a.run_epoch()
        resumed.run_epoch()
        for key, value in _tensors(a).items():
            assert torch.allclose(value, _tensors(resumed)[key], rtol=0, atol=1e-6,
                                  equal_nan=True), key


def test_a_quick_preset_epoch_in_a_bundle_gives_each_members_metrics(grey_digits, float64):
    # The quick preset's training (joint theta update, K 40, batch 256, plain DV) on a slice
    # of the embedded digits with the small LeNet, conv layers under vmap: each member's
    # evaluated metrics within 1e-3 of its run alone.
    from tests.conftest import SMALL_NET_CONFIG
    from unbiased.benchmarks.digits.data import GreyDigits, build
    from unbiased.benchmarks.digits.spec import SPEC

    torch.set_num_threads(1)
    d = grey_digits
    bench = _double(build(GreyDigits(d.train_x[:768], d.train_y[:768], d.test_x[:256],
                                     d.test_y[:256], "mnist5k"), 0.03, seed=0,
                          width=SMALL_NET_CONFIG["width"]))
    keys = set(MIBackpropConfig.__dataclass_fields__) - {"lam", "epochs"}
    cfg = {k: v for k, v in SPEC.presets["quick"].items() if k in keys}
    alone, _, members, _ = _alone_and_bundled(bench, cfg,
                                              points=[(0.0, 1), (1.0, 0), (0.5, 2)])
    for a, m in zip(alone, members, strict=True):
        ea, em = a.evaluate(), m.evaluate()
        assert ea.keys() == em.keys()
        for key, value in ea.items():
            assert math.isclose(value, em[key], abs_tol=1e-3), (key, value, em[key])


def test_a_frozen_member_stays_as_it_was_and_the_others_go_on(float64):
    # A member whose weights went NaN (a diverged trial) is frozen: later epochs leave its
    # state as it was, and NaN never reaches the other members.
    torch.set_num_threads(1)
    bench = _double(biased_tabular(n=192))
    cfg = {**CRITIC, "theta_update": "separate"}
    alone = [MIBackprop(bench, MIBackpropConfig(**cfg, lam=lam), seed=seed) for lam, seed in POINTS]
    members = [MIBackprop(bench, MIBackpropConfig(**cfg, lam=lam), seed=seed)
               for lam, seed in POINTS]
    bundle = MIBackpropBundle(members)
    bundle.run_epoch()
    with torch.no_grad():
        next(iter(bundle.g.params.values()))[1].fill_(float("nan"))
    bundle.freeze(1)
    bundle.sync_members()
    frozen = {k: v.clone() for k, v in _tensors(members[1]).items()}
    bundle.run_epoch()
    stats = bundle.run_epoch()
    for key, value in _tensors(members[1]).items():
        assert torch.equal(value, frozen[key]) or (
            torch.isnan(value).any() and torch.allclose(value, frozen[key], equal_nan=True)), key
    for b in (0, 2):
        for _ in range(3):
            alone[b].run_epoch()
        for key, value in _tensors(alone[b]).items():
            assert torch.allclose(value, _tensors(members[b])[key], rtol=0, atol=1e-6,
                                  equal_nan=True), key
        assert math.isfinite(stats[b].loss_task)


def test_batched_draws_shuffle_each_member_anew_and_resume_at_an_epoch(float64):
    # One draw a step for every member's K + 1 shuffles (a GPU's form): each a permutation,
    # different across members and steps; a bundle rebuilt from its members' checkpoints at
    # an epoch's start goes on as the straight one.
    torch.set_num_threads(1)
    bench = _double(biased_tabular(n=192))
    cfg = {**CRITIC, "theta_update": "separate"}

    def members():
        return [MIBackprop(bench, MIBackpropConfig(**cfg, lam=lam), seed=seed)
                for lam, seed in POINTS]
    straight = MIBackpropBundle(members(), draws="batched")
    straight._draw_step(64)
    perms = straight._perms
    assert perms.shape == (CRITIC["K"] + 1, 3, 64)
    assert torch.equal(perms.sort(-1).values, torch.arange(64).expand_as(perms))
    assert not torch.equal(perms[0, 0], perms[0, 1]) and not torch.equal(perms[0, 0],
                                                                         perms[1, 0])
    straight = MIBackpropBundle(members(), draws="batched")
    straight.run_epoch()
    saved = [m.state_dict() for m in straight.members]
    straight.run_epoch()
    resumed_members = members()
    for m, state in zip(resumed_members, saved, strict=True):
        m.load_state_dict(state)
    resumed = MIBackpropBundle(resumed_members, draws="batched")
    resumed.run_epoch()
    for a, b in zip(straight.members, resumed.members, strict=True):
        for key, value in _tensors(a).items():
            torch.testing.assert_close(value, _tensors(b)[key], rtol=0, atol=0,
                                       equal_nan=True, msg=key)
    exact = MIBackpropBundle(members(), draws="exact")
    exact.run_epoch()
    exact.run_epoch()
    assert not torch.allclose(_tensors(exact.members[2])["mine.T.net.0.weight"],
                              _tensors(straight.members[2])["mine.T.net.0.weight"])


def test_members_that_cannot_share_a_bundle_are_named():
    bench = biased_tabular(n=128)
    base = MIBackprop(bench, MIBackpropConfig(**CRITIC), seed=0)
    other_k = MIBackprop(bench, MIBackpropConfig(**{**CRITIC, "K": 4}), seed=0)
    fresh = MIBackprop(bench, MIBackpropConfig(**{**CRITIC, "inner_z": "fresh"}), seed=0)
    assert bundle_problems([base, MIBackprop(bench, MIBackpropConfig(**CRITIC, lam=0.3), seed=1)]
                           ) == []
    assert "differ in K" in bundle_problems([base, other_k])[0]
    assert "inner_z 'batch' only" in bundle_problems([fresh])[0]
    with pytest.raises(ValueError, match="differ in K"):
        MIBackpropBundle([base, other_k])


def test_a_bf16_bundle_follows_its_members_run_alone_in_bf16():
    # `--amp`: g under bf16 autocast in the bundle, as in a run alone. bf16 keeps 8 bits of
    # mantissa and a vmapped kernel rounds elsewhere than a member's own, so float32 weights
    # (autocast leaves float64 alone): each member's epoch loss and MI within bf16's relative
    # precision of its run alone, and g's outputs in the bundle really bf16.
    torch.set_num_threads(1)
    bench = biased_tabular(n=192)
    cfg = {**CRITIC, "theta_update": "separate", "amp": True}
    alone = [MIBackprop(bench, MIBackpropConfig(**cfg, lam=lam), seed=seed) for lam, seed in POINTS]
    stats_alone = [a.run_epoch() for a in alone]
    members = [MIBackprop(bench, MIBackpropConfig(**cfg, lam=lam), seed=seed)
               for lam, seed in POINTS]
    bundle = MIBackpropBundle(members)
    dtypes = set()
    layers = [m for m in bundle.g.base.modules() if isinstance(m, torch.nn.Linear)]
    assert layers
    hook = layers[0].register_forward_hook(lambda _m, _i, out: dtypes.add(out.dtype))
    stats_bundle = bundle.run_epoch()
    hook.remove()
    assert dtypes == {torch.bfloat16}
    bf16 = 2.0 ** -8
    for sa, sb in zip(stats_alone, stats_bundle, strict=True):
        assert sa.loss_task == pytest.approx(sb.loss_task, rel=bf16)
        assert sa.mi_batch == pytest.approx(sb.mi_batch, rel=2 * bf16, abs=1e-3)
    for a, m in zip(alone, members, strict=True):
        ea, em = a.evaluate(), m.evaluate()
        assert ea.keys() == em.keys()
        for key, value in ea.items():  # an accuracy may move by a few of the 192 rows
            tol = 0.02 if key.endswith("acc") else 4 * bf16
            assert math.isclose(value, em[key], rel_tol=tol, abs_tol=1e-3), (key, value)
