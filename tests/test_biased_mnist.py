"""Biased MNIST (ReBias): the colouring protocol on the embedded digits."""

from __future__ import annotations

import math

import pytest
import torch

from unbiased.benchmarks import biased_mnist as bm


@pytest.mark.parametrize("rho", [0.99, 0.997, 0.999])
def test_each_class_keeps_its_colour_at_rate_rho_and_spreads_the_rest(grey_digits, rho):
    y = grey_digits.train_y
    idx = bm.colour_classes(y, rho, torch.Generator().manual_seed(3))
    for label in range(bm.NUM_CLASSES):
        own = idx[y == label]
        n = len(own)
        assert int((own == label).sum()) == int(n * rho)
        rest = n - int(n * rho)
        counts = torch.bincount(own[own != label], minlength=bm.NUM_CLASSES)
        # Chunks of ceil(rest / 9), one per other colour, the last one shorter.
        assert counts.max() <= math.ceil(rest / 9)
        assert int(counts.sum()) == rest


def test_the_unbiased_test_set_spreads_every_class_over_all_colours(grey_digits):
    y = grey_digits.test_y
    idx = bm.colour_classes(y, bm.UNBIASED_RHO, torch.Generator().manual_seed(0))
    for label in range(bm.NUM_CLASSES):
        counts = torch.bincount(idx[y == label], minlength=bm.NUM_CLASSES)
        assert counts.min() >= 9 and counts.max() <= 11  # 100 test digits a class here


def test_the_digit_is_white_on_its_background_colour(grey_digits):
    grey = grey_digits.train_x[:20]
    idx = torch.arange(20) % bm.NUM_CLASSES
    x = bm.colourise(grey, idx)
    assert x.shape == (20, 3, 28, 28)
    on = grey > 0
    assert torch.all(x.permute(1, 0, 2, 3)[:, on] == 1)
    for i in range(20):
        colour = torch.tensor(bm.COLOURS[int(idx[i])]) / 255.0
        background = x[i][:, ~on[i]]
        assert torch.allclose(background, colour[:, None].expand_as(background))


def test_build_is_a_function_of_rho_and_seed(grey_digits):
    a = bm.build(grey_digits, 0.997, seed=1)
    b = bm.build(grey_digits, 0.997, seed=1)
    c = bm.build(grey_digits, 0.997, seed=2)
    assert torch.equal(a.train.x, b.train.x) and torch.equal(a.train.c, b.train.c)
    assert not torch.equal(a.train.c, c.train.c)
    assert set(a.eval_splits) == {"test_acc", "biased_acc"}
    biased = a.eval_splits["biased_acc"]
    assert torch.equal(biased.c.argmax(1), biased.y)
    assert a.c_dim == bm.NUM_CLASSES and a.bias_classes == (bm.NUM_CLASSES,)
    assert bm.colour_only_accuracy(grey_digits, 0.99, seed=1) == pytest.approx(0.99, abs=1e-3)


@pytest.mark.parametrize("rho", [0.0, -0.1, 1.5])
def test_a_rho_outside_the_unit_interval_is_refused(grey_digits, rho):
    with pytest.raises(ValueError, match="rho"):
        bm.build(grey_digits, rho, seed=0)
