"""`train_eval_rows`: train_acc, mi and mi_eval measured on a fixed random subset of the
training rows instead of all of them (the full-MNIST presets' 10,000 of 60,000), pinned
against the exact values on real digits."""

from __future__ import annotations

import math

import pytest
import torch

from tests.conftest import SMALL_NET_CONFIG
from unbiased.benchmarks.digits.data import build
from unbiased.methods import make_method
from unbiased.mine import estimate_mi, mi_eval

pytestmark = pytest.mark.slow  # trains a model and estimates MI on it, exactly and on a subset

VALUES = {"lam": 1.0, "K": 5, "batch_size": 256, "lr": 1e-3, "mine_lr": 3e-3,
          "inner_z": "batch", "theta_update": "joint"}
ROWS = 1000


@pytest.fixture(scope="module")
def trained(grey_digits):
    """mi_backprop after 2 epochs on the embedded digits (4,000 training rows)."""
    torch.set_num_threads(1)
    bench = build(grey_digits, 0.03, seed=0)
    algo = make_method("mi_backprop", bench, {**VALUES, "train_eval_rows": ROWS}, seed=0)
    for _ in range(2):
        algo.run_epoch()
    return bench, algo


def test_the_subset_is_fixed_by_the_seed_and_labels_stay_aligned(grey_digits, trained):
    bench, algo = trained
    rows = algo.eval_rows
    assert rows is not None and len(rows) == ROWS and len(set(rows.tolist())) == ROWS
    again = make_method("mi_backprop", bench, {**VALUES, "train_eval_rows": ROWS}, seed=0)
    other = make_method("mi_backprop", bench, {**VALUES, "train_eval_rows": ROWS}, seed=1)
    assert torch.equal(again.eval_rows, rows)  # a restarted trial measures the same rows
    assert not torch.equal(other.eval_rows, rows)
    algo.evaluate()
    z, y, c = algo.train_eval_set()
    assert torch.equal(y, bench.train.y[rows]) and torch.equal(c, bench.train.c[rows])
    assert torch.allclose(z, algo.train_features()[rows], atol=1e-5)
    # 0 and a size >= the training set mean every row
    for n in (0, len(bench.train)):
        full = make_method("mi_backprop", bench, {**VALUES, "train_eval_rows": n}, seed=0)
        assert full.eval_rows is None


def test_the_subset_does_not_change_the_training_steps(grey_digits):
    # The same steps with or without the subset, whatever the net: the small one.
    bench = build(grey_digits, 0.03, seed=0, width=SMALL_NET_CONFIG["width"])
    losses = []
    for n in (0, ROWS):
        algo = make_method("mi_backprop", bench, {**VALUES, "train_eval_rows": n}, seed=0)
        losses.append(algo.run_epoch().loss_task)  # the first epoch: before any evaluate()
    assert losses[0] == losses[1]


def test_train_acc_and_mi_on_the_subset_estimate_the_exact_values(trained):
    bench, algo = trained
    metrics = algo.evaluate()
    z_all, logits = algo.outputs(bench.train)
    exact_acc = float((logits.argmax(1) == bench.train.y).float().mean())
    # a simple random sample of ROWS of N rows: binomial std with the finite-population factor
    n_all = len(bench.train)
    std = math.sqrt(exact_acc * (1 - exact_acc) / ROWS * (n_all - ROWS) / (n_all - 1))
    assert 0.3 < exact_acc < 0.99  # a model that fits partly: the bound is not trivial
    assert abs(metrics["train_acc"] - exact_acc) <= 4 * std
    # mi is the mean DV bound over batches of 256: on the subset a mean over 4 batches
    # instead of 16, so its error is set by the spread of one batch's value.
    bs = VALUES["batch_size"]
    gen = torch.Generator().manual_seed(0)
    exact_mi = estimate_mi(algo.mine, z_all, bench.train.c, bs, shuffles=4, generator=gen)
    batch_values = torch.tensor([estimate_mi(algo.mine, z_all[i:i + bs],
                                             bench.train.c[i:i + bs], generator=gen)
                                 for i in range(0, n_all - bs + 1, bs)])
    std_mi = float(batch_values.std()) / math.sqrt(ROWS // bs)
    assert abs(metrics["mi"] - exact_mi) <= 4 * std_mi, (metrics["mi"], exact_mi, std_mi)


def test_mi_eval_on_the_subset_estimates_the_exact_value(trained):
    bench, algo = trained
    z, y, c = algo.train_eval_set()
    z_all = algo.train_features()
    sub = mi_eval(z, c, steps=600)
    exact = [mi_eval(z_all, bench.train.c, seed=s, steps=600) for s in range(2)]
    spread = max(abs(exact[0] - exact[1]), 0.1)
    assert abs(sub - sum(exact) / 2) <= 3 * spread, (sub, exact)
