"""Colored MNIST follows the Kim et al. protocol and is deterministic per seed."""

from __future__ import annotations

import gzip

import pytest
import torch

from unbiased.benchmarks.digits import data as cm
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


def tiny_mnist(root, n_train: int = 20, n_test: int = 10):
    """MNIST's four files, uncompressed, under root/MNIST/raw (what torchvision reads); that
    directory."""
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    gen = torch.Generator().manual_seed(0)
    for name, n in (("train", n_train), ("t10k", n_test)):
        _write_idx(raw / f"{name}-images-idx3-ubyte",
                   torch.randint(0, 256, (n, 28, 28), generator=gen))
        _write_idx(raw / f"{name}-labels-idx1-ubyte", torch.arange(n) % 10)
    return raw


def test_full_mnist_is_read_from_root_with_no_download_attempt(tmp_path, monkeypatch):
    from torchvision.datasets import MNIST

    tiny_mnist(tmp_path)

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


def test_flat_stroke_paints_the_flat_colour_where_grey_is_above_128(grey_digits):
    bench = cm.build(grey_digits, 0.03, seed=0, palette="kim", stroke="flat")
    x = bench.train.x
    grey255 = (grey_digits.train_x * 255).round()
    on = grey255 > 128
    assert (x.permute(1, 0, 2, 3)[:, ~on] == 0).all()  # 128 and below: black
    colours = x.amax(dim=(2, 3))  # (N, 3): one flat colour per digit
    painted = x.permute(0, 2, 3, 1)[on]  # (pixels, 3)
    owner = on.nonzero()[:, 0]
    assert torch.equal(painted, colours[owner])
    # the scaled stroke keeps the grey shading on the same colours
    scaled = cm.build(grey_digits, 0.03, seed=0, palette="kim", stroke="scaled").train.x
    assert torch.allclose(scaled, (grey_digits.train_x.unsqueeze(1) * colours[:, :, None, None]
                                   ).clamp(0, 1))


def test_kim_palette_has_ten_colours_and_its_closest_pair_is_1_and_3(grey_digits):
    k = cm.KIM_COLOURS
    assert k.shape == (10, 3) and ((k >= 0) & (k <= 1)).all()
    dist = torch.cdist(k, k) + torch.eye(10) * 9
    assert divmod(int(dist.argmin()), 10) in {(1, 3), (3, 1)}
    with pytest.raises(ValueError, match="stroke"):
        cm.build(grey_digits, 0.03, seed=0, stroke="bold")


@pytest.mark.parametrize("palette, stroke", [("separated", "scaled"), ("kim", "flat")])
def test_bias_strength_is_computed_on_the_very_c_the_build_makes(grey_digits, palette, stroke):
    bench = cm.build(grey_digits, 0.03, seed=5, palette=palette, stroke=stroke)
    c = cm.train_colour_attribute(grey_digits, 0.03, 5, palette, stroke)
    assert torch.equal(c, bench.train.c)
    assert cm.bias_strength(grey_digits, 0.03, 5, palette, stroke) == \
        cm.colour_only_accuracy(bench.train.c, bench.train.y)


def test_colour_only_accuracy_is_the_majority_label_per_colour_cell():
    c = cm.colour_attribute(torch.tensor([[0.0, 0.0, 0.0]] * 3 + [[0.9, 0.9, 0.9]] * 2))
    y = torch.tensor([1, 1, 2, 3, 4])
    assert cm.colour_only_accuracy(c, y) == pytest.approx(3 / 5)  # 2 of cell 1, 1 of cell 2
    assert cm.colour_only_accuracy(c, torch.tensor([1, 1, 1, 3, 3])) == 1.0


def test_more_noise_and_closer_colours_weaken_the_bias(grey_digits):
    strength = {(p, s): cm.bias_strength(grey_digits, s, 0, p)
                for p in ("separated", "kim") for s in (0.02, 0.05)}
    assert strength["separated", 0.05] < strength["separated", 0.02]
    assert strength["kim", 0.02] < strength["separated", 0.02]
    assert strength["kim", 0.05] < strength["kim", 0.02]
