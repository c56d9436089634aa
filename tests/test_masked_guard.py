"""mi_guard decided on the device: a guarded batch's MI step is computed and masked. Forced to a
NaN or a negative estimate, the masked step must leave everything (g, f, T, both Adams'
moments and step counts, the generators) bit for bit as a task-only step leaves it, and the
next unguarded step must then be the same too."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.test_train import biased_tabular
from unbiased.methods.mi_backprop import MIBackprop, MIBackpropConfig


def _state(algo: MIBackprop) -> list[torch.Tensor]:
    """Every tensor a step can move: weights, both Adams' moments and steps, generators."""
    out = [t.detach().clone() for m in algo.modules().values() for t in m.state_dict().values()]
    for opt in (algo.model_opt, algo.mi_opt):
        if opt is None:
            continue
        for p in [p for group in opt.param_groups for p in group["params"]]:
            state = opt.state.get(p, {})
            out += [state[k].clone() for k in sorted(state)]
    return out + [algo.gen.get_state(), algo.method_gen.get_state()]


def _task_only_step(algo: MIBackprop, x, y, c) -> None:
    """What a guarded batch did before the guard moved onto the device: the estimate drawn
    (its shuffle consumes the method's generator), then an Adam step on the task loss alone."""
    z = algo._features(x)
    algo.mine.lower_bound(z, c, algo.method_gen)
    algo.model_opt.zero_grad(set_to_none=True)
    F.cross_entropy(algo.f(z), y).backward()
    algo.model_opt.step()


def _forcing(algo: MIBackprop, value: str):
    """lower_bound with its value forced: NaN (its gradient NaN too) or -3 nats (its gradient
    the true one)."""
    true_bound = algo.mine.lower_bound

    def forced(z, c, generator=None):
        mi = true_bound(z, c, generator)
        return mi * float("nan") if value == "nan" else mi - mi.detach() - 3.0
    return forced


@pytest.mark.parametrize("theta_update", ["separate", "joint"])
@pytest.mark.parametrize("value", ["nan", "negative"])
def test_a_masked_mi_step_is_bit_for_bit_a_task_only_step(theta_update, value):
    torch.set_num_threads(1)
    bench = biased_tabular(n=256)
    cfg = MIBackpropConfig(lam=1.0, K=2, batch_size=64, lr=1e-2, mine_lr=1e-3, inner_z="batch",
                           theta_update=theta_update, mine_ema_rate=0.01, mine_standardize=True,
                           mi_guard=True)
    masked, reference = MIBackprop(bench, cfg, seed=3), MIBackprop(bench, cfg, seed=3)
    order = torch.randperm(len(bench.train), generator=torch.Generator().manual_seed(0))
    batches = list(bench.train.batches(64, order))
    for algo in (masked, reference):  # two ordinary steps first: both Adams hold moments
        for x, y, c in batches[:2]:
            algo.update(x, y, c, order[:64], bench.train)
    assert masked.mi_opt is None or masked.mi_opt.state, "the MI Adam never stepped"
    assert all(torch.equal(a, b) for a, b in zip(_state(masked), _state(reference),
                                                 strict=True))
    guarded_before = masked.guarded_steps

    x, y, c = batches[2]
    masked.mine.lower_bound = _forcing(masked, value)
    masked._model_step(y, c, masked._features(x))
    del masked.mine.lower_bound
    _task_only_step(reference, x, y, c)
    assert masked.guarded_steps == guarded_before + 1
    after = list(zip(_state(masked), _state(reference), strict=True))
    assert all(torch.equal(a, b) for a, b in after), "the masked step moved something"

    x, y, c = batches[3]  # an ordinary step after it: the skip left no trace
    for algo in (masked, reference):
        algo._model_step(y, c, algo._features(x))
    assert all(torch.equal(a, b) for a, b in zip(_state(masked), _state(reference),
                                                 strict=True))
    assert all(torch.isfinite(t).all() for t in _state(masked)[:-2] if t.is_floating_point())


def test_an_unmasked_step_moves_theta_by_its_mi_gradient():
    # The same forcing at +3 nats passes the guard: theta must then differ from a task-only
    # step (otherwise the test above would hold for a guard that masks everything).
    bench = biased_tabular(n=256)
    cfg = MIBackpropConfig(lam=1.0, K=2, batch_size=64, lr=1e-2, mine_lr=1e-3, inner_z="batch",
                           mi_guard=True)
    passed, reference = MIBackprop(bench, cfg, seed=3), MIBackprop(bench, cfg, seed=3)
    x, y, c = next(bench.train.batches(64))
    true_bound = passed.mine.lower_bound
    passed.mine.lower_bound = lambda z, c, gen=None: (lambda mi: mi - mi.detach() + 3.0)(
        true_bound(z, c, gen))
    passed._model_step(y, c, passed._features(x))
    _task_only_step(reference, x, y, c)
    assert passed.guarded_steps == 0
    assert not all(torch.equal(a, b) for a, b in zip(passed.g.parameters(),
                                                     reference.g.parameters(), strict=True))
