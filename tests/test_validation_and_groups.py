"""The pieces every method shares for the field's protocol: a validation split held out of the
training rows (`--val-frac`), worst-group accuracy on every split a benchmark groups, and the
training sampler (`--sampler`: uniform shuffles, or group by group for any method)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from unbiased.benchmarks import benchmark_spec
from unbiased.benchmarks.digits.data import load_mnist5k
from unbiased.data import (
    VAL_SPLIT,
    Benchmark,
    TensorSplit,
    bias_groups,
    group_accuracies,
    hold_out,
)
from unbiased.methods import make_method
from unbiased.models import MLPFeatures
from unbiased.trial import MemorySession, run_trial

# (y, c) of the training rows: a common group and three rare ones, as under a strong bias.
PAIRS = [(0, 0)] * 30 + [(1, 1)] * 30 + [(0, 1)] * 4 + [(1, 0)] * 2


def _groups(split) -> tuple[torch.Tensor, int]:
    return bias_groups(split.y, split.c, 2, (2,))


def _bench(report: bool = True) -> Benchmark:
    gen = torch.Generator().manual_seed(0)
    y = torch.tensor([p[0] for p in PAIRS])
    c = F.one_hot(torch.tensor([p[1] for p in PAIRS]), 2).float()
    x = torch.randn(len(PAIRS), 3, generator=gen) + c.argmax(1, keepdim=True).float()
    train = TensorSplit(x, y, c)
    return Benchmark("hand", train, {"test_acc": train}, 2, lambda: MLPFeatures(3, 4),
                     z_dim=4, c_dim=2, bias_classes=(2,),
                     report_groups=_groups if report else None)


def _rows(split: TensorSplit) -> set[tuple[float, ...]]:
    return {tuple(row.tolist()) for row in split.x}


def test_the_validation_rows_are_a_seeded_draw_of_the_training_rows_left_out_of_training():
    bench = _bench()
    held = hold_out(bench, 0.25, seed=3)
    val = held.eval_splits[VAL_SPLIT]
    assert (len(held.train), len(val)) == (50, 16)
    assert _rows(held.train) | _rows(val) == _rows(bench.train)
    assert not _rows(held.train) & _rows(val)
    assert held.info["n_val"] == 16 and held.info["n_train"] == 50
    assert _rows(hold_out(bench, 0.25, seed=3).eval_splits[VAL_SPLIT]) == _rows(val)
    assert _rows(hold_out(bench, 0.25, seed=4).eval_splits[VAL_SPLIT]) != _rows(val)
    assert set(held.eval_splits) == {"test_acc", VAL_SPLIT}


def test_a_benchmarks_own_groups_follow_their_rows_into_training():
    bench = _bench()
    own = torch.arange(len(PAIRS)) % 5  # a grouping that is not y x c
    bench.groups = (own, 5)
    held = hold_out(bench, 0.5, seed=0)
    kept = [own[i] for i in range(len(PAIRS))
            if tuple(bench.train.x[i].tolist()) in _rows(held.train)]
    assert held.groups[0].tolist() == [int(g) for g in kept]


@pytest.mark.parametrize("fraction", [0.001, 0.999])
def test_a_fraction_that_leaves_nothing_to_validate_or_to_train_on_is_refused(fraction):
    with pytest.raises(ValueError, match="holds out"):
        hold_out(_bench(), fraction, seed=0)


def test_worst_group_accuracy_is_the_lowest_accuracy_among_the_groups_present():
    pred = torch.tensor([0, 0, 1, 1, 1, 0])
    y = torch.tensor([0, 0, 1, 1, 0, 1])
    groups = torch.tensor([0, 0, 2, 2, 2, 3])  # group 1 empty
    accs, sizes = group_accuracies(pred, y, groups, 4)
    assert sizes.tolist() == [2, 0, 3, 1]
    assert accs[0] == 1.0 and accs[2] == pytest.approx(2 / 3) and accs[3] == 0.0
    assert torch.isnan(accs[1])


def test_each_epoch_reports_every_grouped_splits_worst_group_and_the_validation_groups():
    bench = hold_out(_bench(), 0.3, seed=0)
    algo = make_method("group_reweight", bench, {"lam": 0.0, "batch_size": 8, "lr": 1e-2},
                       seed=0)
    algo.run_epoch()
    metrics = algo.evaluate()
    for name, key in (("test_acc", "test_worst_acc"), (VAL_SPLIT, "val_worst_acc")):
        split = bench.eval_splits[name]
        pred = algo.outputs(split)[1].argmax(1)
        accs, sizes = group_accuracies(pred, split.y, *_groups(split))
        assert metrics[key] == pytest.approx(float(accs[sizes > 0].min()))
        assert metrics[key] <= metrics[name]
    val_sizes = torch.bincount(_groups(bench.eval_splits[VAL_SPLIT])[0], minlength=4)
    assert metrics["val_groups"] == int((val_sizes > 0).sum())
    assert metrics["val_min_group"] == int(val_sizes[val_sizes > 0].min())
    plain = make_method("group_reweight", _bench(report=False), {"lam": 0.0}, seed=0)
    assert not {k for k in plain.evaluate() if "worst_acc" in k or k.startswith("val")}


def test_any_method_draws_its_epoch_group_by_group_with_the_group_sampler():
    bench = _bench()
    groups, _ = bench.train_groups()
    for method in ("group_reweight", "mi_backprop"):
        algo = make_method(method, bench, {"lam": 0.0, "batch_size": 8, "sampler": "groups"},
                           seed=0)
        counts = torch.bincount(groups[algo.epoch_order(len(PAIRS))], minlength=4)
        # 66 rows, 4 groups in every batch of 8: each group about a quarter, not 30 / 2
        assert all(14 <= int(n) <= 19 for n in counts), counts.tolist()


def test_the_methods_own_sampler_is_group_dros_groups_and_everyone_elses_shuffle():
    bench = _bench()
    settings = {"lam": 1.0, "batch_size": 8}
    dro = make_method("group_dro", bench, settings, seed=0)
    dro_groups = make_method("group_dro", bench, {**settings, "sampler": "groups"}, seed=0)
    assert torch.equal(dro.epoch_order(len(PAIRS)), dro_groups.epoch_order(len(PAIRS)))
    reweight = make_method("group_reweight", bench, settings, seed=0)
    shuffled = make_method("group_reweight", bench, {**settings, "sampler": "uniform"}, seed=0)
    assert reweight.batch_sampler is None
    assert torch.equal(reweight.epoch_order(len(PAIRS)), shuffled.epoch_order(len(PAIRS)))
    # at lam 0 every method is ERM on ERM's shuffles, unless the sampler is named
    assert make_method("group_dro", bench, {"lam": 0.0}, seed=0).batch_sampler is None
    resampled = make_method("group_dro", bench, {"lam": 0.0, "sampler": "groups"}, seed=0)
    assert resampled.batch_sampler is not None


def _trial(config: dict) -> list[dict]:
    session = MemorySession()
    run_trial({"method": "group_reweight", "lam": 0.0, "seed": 0, "epochs": 2,
               "batch_size": 8, "lr": 1e-2, "mi_eval_steps": 5, **config},
              lambda cfg: _bench(), session)
    return session.reports


def test_a_trial_with_a_validation_fraction_trains_without_those_rows_and_reports_them():
    plain, none, held = _trial({}), _trial({"val_frac": 0.0}), _trial({"val_frac": 0.25})
    assert [r["train_acc"] for r in plain] == [r["train_acc"] for r in none]
    assert [r["test_acc"] for r in plain] == [r["test_acc"] for r in none]
    assert all("val_acc" not in r for r in plain)
    assert all({"val_acc", "val_worst_acc", "val_groups", "val_min_group"} <= set(r)
               for r in held)
    assert [r["test_acc"] for r in held] != [r["test_acc"] for r in plain]


def test_biased_mnist_and_colored_mnist_report_worst_group_test_accuracy():
    digits = load_mnist5k()
    for name, config in (("biased_mnist", {"rho": 0.99}),
                         ("digits", {"sigma": 0.03, "groups": "cells"})):
        bench = benchmark_spec(name).build({**config, "seed": 0, "device": "cpu"},
                                           digits=digits)
        algo = make_method("group_reweight", bench, {"lam": 0.0}, seed=0)
        metrics = algo.evaluate()
        test = bench.eval_splits["test_acc"]
        groups, count = bench.report_groups(test)
        assert count == 100  # digit x colour: Colored MNIST's palette, not its 5,120 cells
        pred = algo.outputs(test)[1].argmax(1)
        accs, sizes = group_accuracies(pred, test.y, groups, count)
        assert metrics["test_worst_acc"] == pytest.approx(float(accs[sizes > 0].min()))
