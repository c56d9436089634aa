"""Balanced MI (docs/METRICS.md, "Balanced MI"): I(z; c) under the distribution where every
(y, c) group weighs the same, checked against cases with a known answer; and the pieces that
use it (group weights, Colored MNIST's palette groups, mi_backprop's balanced batches,
the trainable's balanced mi_eval)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from unbiased.benchmarks.digits.data import palette_groups
from unbiased.data import Benchmark, TensorSplit, balanced_weights, capped_group_rows
from unbiased.methods import make_method
from unbiased.mine import MINE, dv_bound, estimate_mi, mi_eval
from unbiased.models import MLPFeatures
from unbiased.trial import Plan, mi_eval_set

# (y, c) group sizes: c = y for 90% of the rows, as a strong bias.
SIZES = {(0, 0): 900, (1, 1): 900, (0, 1): 100, (1, 0): 100}
FLIP = 0.2  # z is a variable with 20% of each group's rows flipped, exactly


def _entropy(p: float) -> float:
    return -(p * math.log(p) + (1 - p) * math.log(1 - p))


def _rows(source: str, scale: int = 1
          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(z as a 0/1 tensor, y, c, groups): z = `source` (y or c) with exactly FLIP of each
    group's rows flipped; `scale` times SIZES rows."""
    ys, cs, zs = [], [], []
    for (y, c), size in SIZES.items():
        n = size * scale
        flipped = int(n * FLIP)
        value = y if source == "y" else c
        ys += [y] * n
        cs += [c] * n
        zs += [1 - value] * flipped + [value] * (n - flipped)
    y, c, z = torch.tensor(ys), torch.tensor(cs), torch.tensor(zs)
    return z, y, c, y * 2 + c


# Under the balanced distribution y and c are independent: z from y carries no c at all, z
# from c carries log 2 - H(FLIP). Unweighted, z from y reads I(z; c) with P(z = c) = .74.
BALANCED_FROM_C = math.log(2) - _entropy(FLIP)
PLAIN_FROM_Y = math.log(2) - _entropy(0.9 * (1 - FLIP) + 0.1 * FLIP)


def test_balanced_weights_give_every_present_group_the_same_total():
    groups = torch.tensor([0, 0, 0, 1, 3, 3])
    w = balanced_weights(groups, 5)
    totals = torch.zeros(5).index_add(0, groups, w)
    assert totals[[0, 1, 3]].tolist() == pytest.approx([2.0, 2.0, 2.0])
    assert float(w.mean()) == pytest.approx(1.0)


def _optimal_critic(z: torch.Tensor, c: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """T*(z, c) = log p(z, c) / (p(z) p(c)) of the rows weighted by w: where DV is tight."""
    joint = torch.zeros(2, 2, dtype=torch.float64).index_put_((z, c), w, accumulate=True)
    joint /= joint.sum()
    return (joint / (joint.sum(1, keepdim=True) * joint.sum(0, keepdim=True))).log()


def _dv_all_pairs(t: torch.Tensor, z: torch.Tensor, c: torch.Tensor,
                  w: torch.Tensor | None) -> float:
    """The (weighted) DV bound of critic table t over the rows, its marginal over every
    (i, j) pair of rows (each pair weighted w_i w_j)."""
    t_joint, t_marg = t[z, c], t[z[:, None], c[None, :]].flatten()
    if w is None:
        return float(dv_bound(t_joint, t_marg))
    return float(dv_bound(t_joint, t_marg, w, (w[:, None] * w[None, :]).flatten()))


@pytest.mark.parametrize("source, expected", [("c", BALANCED_FROM_C), ("y", 0.0)])
def test_weighted_dv_at_the_optimal_critic_is_the_balanced_mi(source, expected):
    z, _, c, groups = _rows(source)
    w = balanced_weights(groups, 4).double()
    assert _dv_all_pairs(_optimal_critic(z, c, w), z, c, w) == pytest.approx(expected,
                                                                             abs=1e-9)
    ones = torch.ones(len(z), dtype=torch.float64)
    plain = _optimal_critic(z, c, ones)
    if source == "y":
        # unweighted, z from y reads the bias's share of c; the weighted bound of that very
        # critic is at most the balanced MI, 0
        assert _dv_all_pairs(plain, z, c, None) == pytest.approx(PLAIN_FROM_Y, abs=1e-9)
        assert _dv_all_pairs(plain, z, c, w) <= 1e-9
    else:  # c's marginal is uniform either way: z from c carries the same MI both ways
        assert _dv_all_pairs(plain, z, c, None) == pytest.approx(expected, abs=1e-9)


def test_a_trained_critic_reads_the_balanced_mi_where_the_plain_one_reads_the_label():
    # 6,000 rows: 240 held out of each rare group. Over seeds 1-8 the three estimates were
    # within .055 of their answers (the weighted one from c the widest).
    z_y, y, c, groups = _rows("y", scale=3)
    z_c, *_ = _rows("c", scale=3)
    w = balanced_weights(groups, 4)
    onehot = F.one_hot(c, 2).float()

    def read(z: torch.Tensor, weights: torch.Tensor | None) -> float:
        return mi_eval(F.one_hot(z, 2).float(), onehot, seed=1, steps=600, batch_size=256,
                       weights=weights)

    assert read(z_y, None) == pytest.approx(PLAIN_FROM_Y, abs=0.06)
    assert read(z_y, w) == pytest.approx(0.0, abs=0.02)
    assert read(z_c, w) == pytest.approx(BALANCED_FROM_C, abs=0.06)


def test_unit_weights_give_the_unweighted_estimate():
    gen = torch.Generator().manual_seed(0)
    z, c = torch.randn(300, 3, generator=gen), F.one_hot(torch.arange(300) % 3, 3).float()
    mine = MINE(3, 3)
    plain = estimate_mi(mine, z, c, 64, generator=torch.Generator().manual_seed(5))
    weighted = estimate_mi(mine, z, c, 64, generator=torch.Generator().manual_seed(5),
                           weights=torch.ones(300))
    assert weighted == pytest.approx(plain, abs=1e-5)


def test_palette_groups_are_the_label_and_the_nearest_palette_colour():
    palette = torch.tensor([[1.0, 0, 0], [0, 1, 0], [0, 0, 1]])
    shown = torch.tensor([[0.9, 0.1, 0.0], [0.2, 0.7, 0.0], [0.1, 0.0, 0.6], [0.6, 0.5, 0.0]])
    x = shown[:, :, None, None].expand(4, 3, 2, 2).clone()
    x[:, :, 0, 0] = 0.0  # a dark pixel: the colour shown is the per-channel max
    y = torch.tensor([0, 0, 2, 1])
    split = TensorSplit(x, y, torch.zeros(4, 1))
    groups, count = palette_groups(split, palette)
    assert count == 10 * 3  # y x the palette's colours (10 classes on Colored MNIST)
    assert groups.tolist() == [0 * 3 + 0, 0 * 3 + 1, 2 * 3 + 2, 1 * 3 + 0]


def _bench() -> Benchmark:
    """Two classes, c = y on 90% of the rows."""
    gen = torch.Generator().manual_seed(0)
    y = torch.tensor([0] * 90 + [1] * 90 + [0] * 10 + [1] * 10)
    c_class = torch.cat([y[:180], 1 - y[180:]])
    x = torch.randn(len(y), 4, generator=gen) + y[:, None].float()
    train = TensorSplit(x, y, F.one_hot(c_class, 2).float())
    return Benchmark("hand", train, {"test_acc": train}, 2, lambda: MLPFeatures(4, 3),
                     z_dim=3, c_dim=2, bias_classes=(2,))


def test_balanced_mi_at_lam_zero_leaves_g_and_f_on_ergs_path_and_moves_the_critic():
    bench = _bench()
    settings = {"lam": 0.0, "batch_size": 16, "K": 2, "inner_z": "batch"}
    plain = make_method("mi_backprop", bench, settings, seed=0)
    balanced = make_method("mi_backprop", bench, {**settings, "mi_weights": "groups"}, seed=0)
    plain.run_epoch()
    balanced.run_epoch()
    for a, b in zip(plain.g.parameters(), balanced.g.parameters(), strict=True):
        assert torch.equal(a, b)
    assert not all(torch.equal(a, b) for a, b in zip(plain.mine.parameters(),
                                                    balanced.mine.parameters(), strict=True))


def test_the_critic_reads_group_balanced_batches():
    bench = _bench()
    algo = make_method("mi_backprop", bench, {"lam": 1.0, "batch_size": 8, "K": 1,
                                              "inner_z": "batch", "mi_weights": "groups"},
                       seed=0)
    seen: list[torch.Tensor] = []
    phi_loss = algo.mine.phi_loss

    def record(z, c, *args, **kwargs):
        seen.append(c.argmax(1))
        return phi_loss(z, c, *args, **kwargs)

    algo.mine.phi_loss = record
    rows = torch.arange(8)  # a task batch of group (0, 0) alone
    train = bench.train
    algo.update(train.x[rows], train.y[rows], train.c[rows], rows, train)
    # the four groups, two rows each: c = 0 and c = 1 on half the rows each
    assert seen and seen[0].tolist().count(1) == 4


def test_balanced_mi_needs_the_critic_batches_it_can_draw():
    with pytest.raises(ValueError, match="inner_z 'batch' or 'fresh'"):
        make_method("mi_backprop", _bench(), {"mi_weights": "groups", "inner_z": "bank"},
                    seed=0)


def test_the_balanced_mi_eval_reads_every_training_row_with_its_weight():
    bench = _bench()
    algo = make_method("mi_backprop", bench, {"lam": 0.0, "train_eval_rows": 20}, seed=0)
    algo.evaluate()
    plan = Plan.of({"epochs": 1, "seed": 0, "mi_eval_weights": "groups"})
    z, y, c, w = mi_eval_set(algo, plan)
    assert len(z) == len(y) == len(w) == 200
    assert float(w[:90].sum()) == pytest.approx(float(w[180:190].sum()))
    z, _, _, w = mi_eval_set(algo, Plan.of({"epochs": 1, "seed": 0}))
    assert len(z) == 20 and w is None


def test_capped_group_rows_keep_every_row_of_a_small_group_and_a_seeded_draw_of_a_large_one():
    *_, groups = _rows("c")  # group sizes 900, 900, 100, 100
    rows = capped_group_rows(groups, 150, seed=0)
    assert torch.bincount(groups[rows]).tolist() == [150, 100, 100, 150]
    assert bool((rows[1:] > rows[:-1]).all())  # ascending, no row twice
    small = torch.nonzero(groups == 1).flatten()
    assert set(small.tolist()) <= set(rows.tolist())
    assert torch.equal(rows, capped_group_rows(groups, 150, seed=0))
    assert not torch.equal(rows, capped_group_rows(groups, 150, seed=1))
    assert torch.equal(capped_group_rows(groups, 900, seed=5), torch.arange(len(groups)))
    with pytest.raises(ValueError, match="at least 1"):
        capped_group_rows(groups, 0, seed=0)


def test_a_capped_balanced_estimate_reads_the_capped_rows_each_group_weighing_the_same():
    bench = _bench()  # group sizes 90, 90, 10, 10
    algo = make_method("mi_backprop", bench, {"lam": 0.0}, seed=0)
    capped = Plan.of({"epochs": 1, "seed": 0, "mi_eval_weights": "groups",
                      "mi_eval_group_rows": 30})
    z, y, c, w = mi_eval_set(algo, capped)
    assert len(z) == len(y) == len(c) == len(w) == 80
    groups = y * 2 + c.argmax(1)
    totals = [float(w[groups == g].sum()) for g in range(4)]
    assert totals == pytest.approx([20.0] * 4)
    whole = mi_eval_set(algo, Plan.of({"epochs": 1, "seed": 0, "mi_eval_weights": "groups"}))
    wide = mi_eval_set(algo, Plan.of({"epochs": 1, "seed": 0, "mi_eval_weights": "groups",
                                      "mi_eval_group_rows": 90}))
    for every, at_cap in zip(whole, wide, strict=True):
        assert torch.equal(every, at_cap)


def test_colored_mnist_offers_palette_groups_to_the_group_methods():
    from unbiased.benchmarks.digits import spec as digits

    config = {"source": "mnist5k", "sigma": 0.05, "seed": 0, "palette": "kim",
              "stroke": "flat"}
    cells = digits.SPEC.build(config)
    palette = digits.SPEC.build({**config, "groups": "palette"})
    assert cells.groups is None and cells.train_groups()[1] == 10 * 8 ** 3
    groups, count = palette.train_groups()
    assert count == 100 and torch.equal(groups // 10, palette.train.y)
    # at sigma .05 a good share of the digits show a colour nearer another class's
    misled = float((groups % 10 != palette.train.y).float().mean())
    assert 0.2 < misled < 0.6
    algo = make_method("group_reweight", palette, {"lam": 1.0}, seed=0)
    assert len(algo.group_sizes) == 100 and torch.equal(algo.group_of_row, groups)
