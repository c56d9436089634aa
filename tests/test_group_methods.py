"""group_reweight and group_dro checked against their definitions on a hand-made benchmark:
(y, c) groups of known sizes, one of them empty."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from unbiased.data import Benchmark, GroupSampler, TensorSplit, bias_groups
from unbiased.methods import make_method
from unbiased.methods.group_dro import robust_loss
from unbiased.models import MLPFeatures

# (y, c) of the training rows: group (0, 0) 5 rows, (0, 1) 1, (1, 1) 4, (1, 0) none.
PAIRS = [(0, 0)] * 5 + [(0, 1)] + [(1, 1)] * 4
SIZES = {(0, 0): 5, (0, 1): 1, (1, 1): 4}


def _bench() -> Benchmark:
    gen = torch.Generator().manual_seed(0)
    y = torch.tensor([p[0] for p in PAIRS])
    c = F.one_hot(torch.tensor([p[1] for p in PAIRS]), 2).float()  # one head, 2 classes
    x = torch.randn(len(PAIRS), 3, generator=gen)
    train = TensorSplit(x, y, c)
    return Benchmark("hand", train, {"test_acc": train}, 2, lambda: MLPFeatures(3, 4),
                     z_dim=4, c_dim=2, bias_classes=(2,))


def _losses(algo, bench) -> torch.Tensor:
    """Each training row's loss at the method's current weights, in row order."""
    with torch.no_grad():
        return F.cross_entropy(algo.f(algo.g(bench.train.x)), bench.train.y, reduction="none")


def test_groups_are_y_times_each_bias_class_combination():
    groups, count = bias_groups(torch.tensor([0, 1, 2]), torch.tensor([[0.0, 1, 0, 0, 1],
                                                                        [1, 0, 0, 1, 0],
                                                                        [0, 1, 1, 0, 0]]),
                                3, (2, 3))
    # cell = head0 * 3 + head1; group = y * 6 + cell
    assert count == 18 and groups.tolist() == [0 * 6 + 1 * 3 + 2, 1 * 6 + 0 * 3 + 1,
                                               2 * 6 + 1 * 3 + 0]


@pytest.mark.parametrize("lam", [1.0, 0.5])
def test_a_reweighted_batch_loss_is_the_hand_computed_weighted_mean(lam):
    torch.manual_seed(0)
    bench = _bench()
    algo = make_method("group_reweight", bench, {"lam": lam, "batch_size": 16}, seed=0)
    assert algo.empty_groups == 1  # (1, 0)
    losses = _losses(algo, bench)
    weights = torch.tensor([(len(PAIRS) / SIZES[p]) ** lam for p in PAIRS])
    expected = float((weights * losses).sum() / weights.sum())
    rows = torch.arange(len(PAIRS))
    plain, weighted = algo.update(bench.train.x, bench.train.y, bench.train.c, rows,
                                  bench.train)
    assert float(weighted) == pytest.approx(expected, rel=1e-6)
    assert float(plain) == pytest.approx(float(losses.mean()), rel=1e-6)
    assert algo.evaluate()["empty_groups"] == 1


def test_at_lam_one_every_present_group_weighs_the_same():
    bench = _bench()
    algo = make_method("group_reweight", bench, {"lam": 1.0}, seed=0)
    totals = {}
    for pair, w in zip(PAIRS, algo.row_weight.tolist(), strict=True):
        totals[pair] = totals.get(pair, 0.0) + w
    assert len(totals) == 3 and max(totals.values()) == pytest.approx(min(totals.values()))


def test_group_dro_q_after_one_step_is_the_exponentiated_gradient_update_by_hand():
    torch.manual_seed(0)
    bench = _bench()
    step = 0.5
    algo = make_method("group_dro", bench, {"lam": 1.0, "dro_step": step}, seed=0)
    # q starts uniform over the three present groups; the empty group (1, 0) has 0
    index = {(0, 0): 0, (0, 1): 1, (1, 0): 2, (1, 1): 3}  # group = y * 2 + c
    assert algo.q.tolist() == pytest.approx([1 / 3, 1 / 3, 0.0, 1 / 3])
    losses = _losses(algo, bench)
    rows = torch.tensor([0, 1, 5, 6])  # a batch with (0, 0) twice, (0, 1), (1, 1): no (1, 0)
    means = {}
    for r in rows.tolist():
        means.setdefault(PAIRS[r], []).append(float(losses[r]))
    mean = {p: sum(v) / len(v) for p, v in means.items()}
    raw = {p: 1 / 3 * math.exp(step * mean.get(p, 0.0)) for p in SIZES}
    total = sum(raw.values())
    q_hand = {p: v / total for p, v in raw.items()}
    robust_hand = sum(q_hand[p] * mean[p] for p in mean)
    _, robust = algo.update(bench.train.x[rows], bench.train.y[rows], bench.train.c[rows],
                            rows, bench.train)
    for pair, i in index.items():
        assert float(algo.q[i]) == pytest.approx(q_hand.get(pair, 0.0), rel=1e-6), pair
    assert float(robust) == pytest.approx(robust_hand, rel=1e-6)


def test_robust_loss_leaves_an_absent_group_as_it_was_relative_to_the_others():
    q = torch.tensor([0.25, 0.25, 0.5])
    value = robust_loss(q, torch.tensor([1.0, 3.0]), torch.tensor([0, 0]), step=1.0)
    # only group 0 moved: exp(2) against 1 and 1, then normalised
    z = 0.25 * math.exp(2.0) + 0.25 + 0.5
    assert q.tolist() == pytest.approx([0.25 * math.exp(2.0) / z, 0.25 / z, 0.5 / z])
    assert float(value) == pytest.approx(q[0].item() * 2.0)


def test_group_dro_resumes_with_its_weights():
    bench = _bench()
    straight = make_method("group_dro", bench, {"lam": 1.0, "batch_size": 4}, seed=1)
    straight.run_epoch()
    state = straight.state_dict()
    straight.run_epoch()
    resumed = make_method("group_dro", bench, {"lam": 1.0, "batch_size": 4}, seed=7)
    resumed.load_state_dict(state)
    resumed.run_epoch()
    assert torch.equal(straight.q, resumed.q)
    assert not torch.equal(straight.q, make_method("group_dro", bench, {"lam": 1.0},
                                                   seed=1).q)


def test_published_group_dro_steps_g_and_f_on_the_robust_loss_alone():
    bench = _bench()
    settings = {"lam": 1.0, "dro_step": 0.5, "sampler": "uniform"}
    algo = make_method("group_dro", bench, settings, seed=0)
    twin = make_method("group_dro", bench, settings, seed=0)
    rows = torch.tensor([0, 1, 5, 6, 7])
    x, y = bench.train.x[rows], bench.train.y[rows]
    # by hand: q moved by the batch's group means, then one Adam step on sum_g q_g l_g
    losses = F.cross_entropy(twin.f(twin.g(x)), y, reduction="none")
    groups = twin.group_of_row[rows]
    means = torch.zeros(4).index_add(0, groups, losses) / torch.zeros(4).index_add(
        0, groups, torch.ones(5)).clamp_min(1)
    q = twin.q * torch.exp(0.5 * means.detach())
    q = q / q.sum()
    twin.model_opt.zero_grad()
    (q * means).sum().backward()
    twin.model_opt.step()
    algo.update(x, y, bench.train.c[rows], rows, bench.train)
    for mine, hand in zip(algo.g.parameters(), twin.g.parameters(), strict=True):
        assert torch.allclose(mine, hand, atol=1e-7)
    assert torch.allclose(algo.q, q)


def test_the_penalty_variant_steps_on_the_task_loss_plus_lam_times_the_robust_loss():
    bench = _bench()
    settings = {"lam": 2.0, "dro_step": 0.5, "dro_loss": "penalty", "sampler": "uniform"}
    algo = make_method("group_dro", bench, settings, seed=0)
    twin = make_method("group_dro", bench, settings, seed=0)
    rows = torch.tensor([0, 5, 6])
    x, y = bench.train.x[rows], bench.train.y[rows]
    losses = F.cross_entropy(twin.f(twin.g(x)), y, reduction="none")
    robust = robust_loss(twin.q, losses, twin.group_of_row[rows], 0.5)
    twin.model_opt.zero_grad()
    (losses.mean() + 2.0 * robust).backward()
    twin.model_opt.step()
    algo.update(x, y, bench.train.c[rows], rows, bench.train)
    for mine, hand in zip(algo.g.parameters(), twin.g.parameters(), strict=True):
        assert torch.allclose(mine, hand, atol=1e-7)


def test_the_adjustment_moves_q_by_c_over_the_root_of_each_groups_size():
    q = torch.tensor([0.5, 0.5])
    adjustment = 2.0 / torch.tensor([4.0, 1.0]).sqrt()
    robust_loss(q, torch.tensor([1.0, 1.0]), torch.tensor([0, 1]), step=1.0,
                adjustment=adjustment)
    raw = [0.5 * math.exp(1.0 + 1.0), 0.5 * math.exp(1.0 + 2.0)]
    assert q.tolist() == pytest.approx([r / sum(raw) for r in raw])
    algo = make_method("group_dro", _bench(), {"dro_adjustment": 2.0}, seed=0)
    sizes = torch.tensor([5.0, 1.0, 1.0, 4.0])  # the empty group (1, 0) clamped to 1
    assert torch.allclose(algo.adjustment, 2.0 / sizes.sqrt())


def test_the_balanced_sampler_puts_every_present_group_in_every_step():
    groups = torch.tensor([0] * 50 + [2] * 3 + [3] * 7 + [5])  # groups 1 and 4 empty
    gen = torch.Generator().manual_seed(0)
    sampler = GroupSampler(groups, 6)
    order = sampler.epoch(8, gen)
    assert len(order) == len(groups)
    for start in range(0, len(order), 8):
        batch = groups[order[start:start + 8]]
        present = set(batch.tolist())
        assert present <= {0, 2, 3, 5}
        if len(batch) >= 4:
            assert present == {0, 2, 3, 5}, batch.tolist()
    # a batch smaller than the groups takes a random few each step: each group ~ 1/4 of the
    # rows (61 / 4), not its share of the data (50 / 61 for group 0, 1 / 61 for group 5)
    order = sampler.epoch(3, gen)
    counts = torch.bincount(groups[order], minlength=6)
    assert counts[1] == counts[4] == 0
    assert all(8 <= int(counts[g]) <= 23 for g in (0, 2, 3, 5)), counts.tolist()
    assert set(groups[sampler.batch(4, gen)].tolist()) == {0, 2, 3, 5}


def test_group_dro_uses_the_balanced_sampler_only_when_it_trains_robustly():
    bench = _bench()
    algo = make_method("group_dro", bench, {"lam": 1.0, "batch_size": 4}, seed=0)
    erm = make_method("group_dro", bench, {"lam": 0.0, "batch_size": 4}, seed=0)
    plain = make_method("group_reweight", bench, {"lam": 0.0, "batch_size": 4}, seed=0)
    order = algo.epoch_order(len(PAIRS))
    assert set(algo.group_of_row[order[:4]].tolist()) == {0, 1, 3}  # (0,0), (0,1), (1,1)
    assert torch.equal(erm.epoch_order(len(PAIRS)), plain.epoch_order(len(PAIRS)))
    erm.run_epoch()
    plain.run_epoch()
    for a, b in zip(erm.g.parameters(), plain.g.parameters(), strict=True):
        assert torch.equal(a, b)


def test_each_epoch_reports_q_and_the_worst_groups_training_loss():
    bench = _bench()
    algo = make_method("group_dro", bench, {"lam": 1.0, "batch_size": 4}, seed=0)
    algo.run_epoch()
    metrics = algo.evaluate()
    q = algo.q[algo.q > 0]
    assert metrics["dro_q_max"] == pytest.approx(float(algo.q.max()))
    assert metrics["dro_q_entropy"] == pytest.approx(float(-(q * q.log()).sum()), rel=1e-6)
    assert metrics["dro_q_entropy"] <= math.log(3) + 1e-6
    losses = _losses(algo, bench)
    by_group: dict[tuple[int, int], list[float]] = {}
    for pair, loss in zip(PAIRS, losses.tolist(), strict=True):
        by_group.setdefault(pair, []).append(loss)
    worst = max(sum(v) / len(v) for v in by_group.values())
    assert metrics["worst_group_loss"] == pytest.approx(worst, rel=1e-5)
