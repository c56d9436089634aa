"""Colored MNIST follows the Kim et al. protocol and is deterministic per seed."""

from __future__ import annotations

import gzip

import pytest
import torch

from unbiased.benchmarks import colored_mnist as cm
from unbiased.data import DataError


def test_embedded_subset_is_real_mnist_split_400_100_per_class(grey_digits):
    d = grey_digits
    assert d.train_x.shape == (4000, 28, 28) and d.test_x.shape == (1000, 28, 28)
    assert torch.bincount(d.train_y).tolist() == [400] * 10
    assert torch.bincount(d.test_y).tolist() == [100] * 10
    assert 0.0 == float(d.train_x.min()) and float(d.train_x.max()) == 1.0


def test_same_seed_same_tensors_other_seed_other_colours(grey_digits):
    a = cm.build(grey_digits, 0.02, seed=3)
    b = cm.build(grey_digits, 0.02, seed=3)
    c = cm.build(grey_digits, 0.02, seed=4)
    assert torch.equal(a.train.x, b.train.x) and torch.equal(a.eval_splits["test_acc"].x,
                                                             b.eval_splits["test_acc"].x)
    assert not torch.equal(a.train.x, c.train.x)


def test_training_colours_follow_class_means_with_sigma_as_variance(grey_digits):
    sigma = 0.04  # variance; std = 0.2
    bench = cm.build(grey_digits, sigma, seed=0)
    colours = bench.train.x.amax(dim=(2, 3))  # per-channel max = the colour (max grey is 1)
    means = cm.CLASS_COLOURS[bench.train.y]
    resid = colours - means
    # Channels whose mean is 0.5 are never clipped: their spread is the noise's std.
    mid = means == 0.5
    assert resid[mid].std().item() == pytest.approx(sigma**0.5, rel=0.1)
    assert resid[mid].mean().abs().item() < 0.03


def test_background_black_and_c_is_24d_one_hot_per_channel(grey_digits):
    bench = cm.build(grey_digits, 0.02, seed=0)
    x, c = bench.train.x, bench.train.c
    background = grey_digits.train_x == 0
    assert (x.permute(1, 0, 2, 3)[:, background] == 0).all()
    assert c.shape == (4000, 24)
    assert torch.equal(c.reshape(-1, 3, 8).sum(dim=2), torch.ones(4000, 3))
    # c is the quantised per-channel max
    bins = (x.amax(dim=(2, 3)) * 8).long().clamp(max=7)
    assert torch.equal(c.reshape(-1, 3, 8).argmax(dim=2), bins)


def test_colour_predicts_label_in_train_but_not_in_test(grey_digits):
    bench = cm.build(grey_digits, 0.02, seed=0)

    def colour_class_hits(split):
        colours = split.x.amax(dim=(2, 3))
        nearest = torch.cdist(colours, cm.CLASS_COLOURS).argmin(dim=1)
        return (nearest == split.y).float().mean().item()

    assert colour_class_hits(bench.train) > 0.9  # strongly biased
    assert colour_class_hits(bench.eval_splits["test_acc"]) < 0.2  # ~ 1/10 by chance


def test_sigma_outside_unit_interval_is_rejected(grey_digits):
    with pytest.raises(ValueError, match="sigma"):
        cm.build(grey_digits, 0.0, seed=0)


def test_missing_full_mnist_says_how_to_get_it(tmp_path):
    with pytest.raises(DataError, match="download") as info:
        cm.load_mnist(tmp_path / "nowhere", download=False)
    assert "\n" not in str(info.value)


def test_unreadable_subset_is_one_line_error(tmp_path):
    bad = tmp_path / "mnist_5k.csv.gz"
    with gzip.open(bad, "wt") as fh:
        fh.write("1,2,3\n4,5,6\n")
    with pytest.raises(DataError, match="785 columns"):
        cm.load_mnist5k(bad)
    with pytest.raises(DataError, match="not found"):
        cm.load_mnist5k(tmp_path / "missing.csv.gz")


def _write_idx(path, data: torch.Tensor) -> None:
    """An IDX file as MNIST ships it: magic (0x0801 labels / 0x0803 images), dims, bytes."""
    import struct

    dims = list(data.shape)
    magic = 0x0800 + len(dims)
    with open(path, "wb") as fh:
        fh.write(struct.pack(">I", magic))
        for d in dims:
            fh.write(struct.pack(">I", d))
        fh.write(data.to(torch.uint8).numpy().tobytes())


def _tiny_mnist(root, n_train: int = 20, n_test: int = 10):
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    gen = torch.Generator().manual_seed(0)
    for name, n in (("train", n_train), ("t10k", n_test)):
        _write_idx(raw / f"{name}-images-idx3-ubyte",
                   torch.randint(0, 256, (n, 28, 28), generator=gen))
        _write_idx(raw / f"{name}-labels-idx1-ubyte", torch.arange(n) % 10)


def test_full_mnist_is_read_from_root_with_no_download_attempt(tmp_path, monkeypatch):
    from torchvision.datasets import MNIST

    _tiny_mnist(tmp_path)

    def no_network(self):
        raise AssertionError("download attempted although the files are under --root")

    monkeypatch.setattr(MNIST, "download", no_network)
    # download=True is what the drivers pass: with the files present it must not be used.
    d = cm.load_grey_digits("mnist", tmp_path, download=True)
    assert d.train_x.shape == (20, 28, 28) and d.test_x.shape == (10, 28, 28)
    assert d.train_y.tolist() == [i % 10 for i in range(20)]
    assert float(d.train_x.max()) <= 1.0


def test_missing_full_mnist_without_download_says_where_to_put_the_files(tmp_path):
    with pytest.raises(DataError) as err:
        cm.load_grey_digits("mnist", tmp_path, download=False)
    message = str(err.value)
    assert "\n" not in message and str(tmp_path / "MNIST" / "raw") in message
    assert "train-images-idx3-ubyte" in message


def test_palette_sets_the_class_colours_and_is_checked(grey_digits):
    bench = cm.build(grey_digits, 0.02, seed=0, palette="distinct")
    colours = bench.train.x.amax(dim=(2, 3))
    nearest = torch.cdist(colours, cm.DISTINCT_COLOURS).argmin(dim=1)
    assert (nearest == bench.train.y).float().mean() > 0.8  # noise moves some across
    default = cm.build(grey_digits, 0.02, seed=0)
    assert not torch.equal(default.train.x, bench.train.x)
    assert torch.equal(default.train.y, bench.train.y)
    with pytest.raises(ValueError, match="palette"):
        cm.build(grey_digits, 0.02, seed=0, palette="rainbow")
