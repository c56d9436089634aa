"""unbiased/kim_protocol.py (Kim et al.'s own Colored MNIST protocol) and its CLI,
bench/kim_protocol.py: shapes, the pixel labels, the losses against Kim's formulas, one epoch
of each phase on 160 real digits, the CLI's bad input."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from unbiased.kim_protocol import (
    IGNORE_INDEX,
    ColourHeads,
    FlatStop,
    KimConfig,
    KimNet,
    colour_loss,
    finetune_lntl,
    grad_reverse,
    neg_entropy,
    normalise_input,
    pixel_colour_targets,
    scheduled_lr,
    train_baseline,
)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_kimnet_returns_logits_and_the_32x14x14_map_after_relu():
    torch.manual_seed(0)
    net = KimNet()
    logits, z = net(torch.rand(4, 3, 28, 28))
    assert logits.shape == (4, 10)
    assert z.shape == (4, 32, 14, 14)
    assert (z >= 0).all()
    assert torch.equal(net.features(torch.ones(2, 3, 28, 28)), net(torch.ones(2, 3, 28, 28))[1])
    assert ColourHeads()(z).shape == (4, 3, 8, 14, 14)
    # He (fan-out) init: std sqrt(2 / (k * k * out)); conv4 has 36,864 weights.
    assert net.conv4.weight.std().item() == pytest.approx(math.sqrt(2 / (9 * 64)), rel=0.03)


def test_fused_heads_compute_three_separate_kim_predictors():
    torch.manual_seed(0)
    fused = ColourHeads()
    fused.bn1.weight.data.uniform_(0.5, 1.5)
    fused.bn1.bias.data.uniform_(-0.5, 0.5)
    z = torch.rand(2, 32, 14, 14)
    out = fused(z)
    for i in range(3):
        conv1, bn, conv2 = nn.Conv2d(32, 32, 3, padding=1), nn.BatchNorm2d(32), \
            nn.Conv2d(32, 8, 3, padding=1)
        sl, so = slice(32 * i, 32 * i + 32), slice(8 * i, 8 * i + 8)
        conv1.weight.data, conv1.bias.data = fused.conv1.weight.data[sl], fused.conv1.bias.data[sl]
        bn.weight.data, bn.bias.data = fused.bn1.weight.data[sl], fused.bn1.bias.data[sl]
        conv2.weight.data, conv2.bias.data = fused.conv2.weight.data[so], fused.conv2.bias.data[so]
        ref = conv2(F.relu(bn(conv1(z))))  # models.py Predictor, train mode
        torch.testing.assert_close(out[:, i], ref, rtol=1e-5, atol=1e-5)


def _kim_label_image(image: np.ndarray) -> torch.Tensor:
    """data_loader.py:44-52 on one HxWx3 uint8 image (old torch's integer ByteTensor
    division written as a floor division)."""
    from PIL import Image

    label_image = Image.fromarray(image).resize((14, 14), Image.NEAREST)
    label_image = torch.from_numpy(np.transpose(np.asarray(label_image), (2, 0, 1)).copy())
    mask_image = torch.lt(label_image.float() - 0.00001, 0.0).long() * 255
    return torch.div(label_image.long(), 32, rounding_mode="floor") + mask_image


def test_pixel_targets_bins_ignore_and_sampled_pixels_by_hand():
    x = torch.zeros(1, 3, 28, 28)
    # PIL NEAREST 28 -> 14 samples rows / columns 1, 3, ..., 27.
    x[0, 0, 1, 1] = 31 / 255  # bin 0 (not ignored: only 0 is)
    x[0, 1, 1, 1] = 32 / 255  # bin 1
    x[0, 2, 1, 1] = 1.0  # 255 -> bin 7
    x[0, :, 3, 5] = 0.5  # 127.5 -> 128 -> bin 4
    x[0, :, 0, 0] = 1.0  # an even pixel: never sampled
    t = pixel_colour_targets(x)
    assert t.shape == (1, 3, 14, 14) and t.dtype == torch.int64
    assert t[0, :, 0, 0].tolist() == [0, 1, 7]
    assert t[0, :, 1, 2].tolist() == [4, 4, 4]
    t[0, :, 0, 0] = IGNORE_INDEX
    t[0, :, 1, 2] = IGNORE_INDEX
    assert (t == IGNORE_INDEX).all()  # every other pixel is black


def test_pixel_targets_match_kims_pil_code_on_random_images():
    gen = torch.Generator().manual_seed(0)
    levels = torch.randint(0, 256, (3, 3, 28, 28), generator=gen)
    levels[torch.rand(levels.shape, generator=gen) < 0.5] = 0
    ours = pixel_colour_targets(levels.float() / 255)
    for i in range(3):
        image = levels[i].permute(1, 2, 0).numpy().astype(np.uint8)
        assert torch.equal(ours[i], _kim_label_image(image))


def test_input_normalisation_is_kims():
    x = torch.full((1, 3, 2, 2), 0.5)
    ref = (torch.full((3,), 128 / 255) - torch.tensor([0.4914, 0.4822, 0.4465])) \
        / torch.tensor([0.2023, 0.1994, 0.2010])
    torch.testing.assert_close(normalise_input(x)[0, :, 0, 0], ref)


def test_losses_match_kims_formulas():
    torch.manual_seed(0)
    logits = torch.randn(4, 3, 8, 14, 14)
    targets = torch.randint(0, 8, (4, 3, 14, 14))
    targets[torch.rand(targets.shape) < 0.6] = IGNORE_INDEX
    ce = nn.CrossEntropyLoss(ignore_index=255)  # trainer.py:46, 156-160
    ref = sum(ce(logits[:, i], targets[:, i]) for i in range(3))
    torch.testing.assert_close(colour_loss(logits, targets), ref)
    p = [F.softmax(logits[:, i], dim=1) for i in range(3)]  # trainer.py:131-135
    ref_ent = sum(torch.mean(torch.sum(q * torch.log(q), 1)) for q in p) / 3.0
    torch.testing.assert_close(neg_entropy(logits), ref_ent)
    # No valid pixel for a channel: 0 for that head (Kim's: NaN).
    targets[:, 1] = IGNORE_INDEX
    assert torch.isfinite(colour_loss(logits, targets))


def test_grad_reverse_scales_and_flips():
    x = torch.ones(3, requires_grad=True)
    grad_reverse(x, 0.1).sum().backward()
    torch.testing.assert_close(x.grad, torch.full((3,), -0.1))


def test_lr_schedule_and_flat_stop():
    cfg = KimConfig()
    assert [scheduled_lr(0.01, e, cfg) for e in (0, 39, 40, 80, 100)] == pytest.approx(
        [0.01, 0.01, 0.001, 0.0001, 0.0001])
    flat = FlatStop(3, tol=0.002)
    # 0.5 improves; 0.501 and 0.5015 are within 0.002 of it; 0.503 improves (the reference
    # becomes 0.503); three epochs within 0.002 of 0.503 follow: flat.
    assert [flat(v) for v in (0.5, 0.501, 0.5015, 0.503, 0.504, 0.5, 0.5045)] == \
        [False, False, False, False, False, False, True]
    creep = FlatStop(3, tol=0.002)
    assert not any(creep(0.5 + 0.001 * i) for i in range(30))
    assert not any(FlatStop(0)(0.5) for _ in range(5))


@pytest.fixture(scope="module")
def tiny_splits():
    from unbiased.benchmarks.colored_mnist import build, load_grey_digits
    from unbiased.data import TensorSplit

    bench = build(load_grey_digits("mnist5k", None), 0.03, 0, palette="kim", stroke="flat")
    tr, te = bench.train, bench.eval_splits["test_acc"]
    g = torch.Generator().manual_seed(0)
    rows, test_rows = torch.randperm(len(tr), generator=g)[:160], torch.arange(0, len(te), 10)
    return (TensorSplit(tr.x[rows], tr.y[rows], tr.c[rows]),
            TensorSplit(te.x[test_rows], te.y[test_rows], te.c[test_rows]))


def test_one_baseline_and_one_lntl_epoch_run_with_kims_resume(tiny_splits):
    train, test = tiny_splits
    cfg = KimConfig(lr_decay_period=1, train_eval_size=128)
    seen = []
    base = train_baseline(train, test, "cpu", seed=0, epochs=2, cfg=cfg, callback=seen.append)
    assert [m["lr"] for m in base.history] == pytest.approx([0.01, 0.001])
    assert base.history[1]["train_loss"] < base.history[0]["train_loss"]
    # Kim's checkpoint: the lr after the last scheduler step, 0.01 * 0.1 ** 2.
    assert base.optimizer_state["param_groups"][0]["lr"] == pytest.approx(1e-4)
    before = [p.detach().clone() for p in base.net.parameters()]
    lntl = finetune_lntl(base.net, train, test, "cpu", seed=0, epochs=1, cfg=cfg,
                         optimizer_state=base.optimizer_state, callback=seen.append)
    assert [m["phase"] for m in seen] == ["baseline", "baseline", "lntl"]
    m = lntl.history[0]
    assert m["lr"] == pytest.approx(1e-4) and m["head_lr"] == pytest.approx(1e-3)
    for key in ("train_loss", "train_acc", "test_acc", "test_loss", "neg_entropy", "head_loss",
                "head_acc", "epoch_s"):
        assert math.isfinite(m[key]), key
    assert -math.log(8) - 1e-4 <= m["neg_entropy"] <= 0
    # The baseline net is copied, not changed; the fine-tuned one moved.
    assert all(torch.equal(a, b) for a, b in zip(before, base.net.parameters(), strict=True))
    assert any(not torch.equal(a, b) for a, b in zip(before, lntl.net.parameters(),
                                                     strict=True))


def test_callback_stops_a_phase(tiny_splits):
    train, test = tiny_splits
    cfg = KimConfig(train_eval_size=64)
    res = train_baseline(train, test, "cpu", seed=1, epochs=5, cfg=cfg,
                         callback=lambda m: m["epoch"] >= 1)
    assert res.stopped_early and len(res.history) == 1
    assert res.optimizer_state["param_groups"][0]["lr"] == pytest.approx(0.01)


@pytest.mark.parametrize("args, says", [
    (["--sigma", "abc"], "--sigma"),
    (["--sigma", "0.03,1.5"], "(0, 1)"),
    (["--baseline-epochs", "0"], "--baseline-epochs"),
    (["--max-minutes", "-1"], "--max-minutes"),
    (["--root", "/nonexistent/mnist"], "not a directory"),
    (["--bogus"], "unrecognized"),
])
def test_cli_bad_input_is_one_error_line_and_exit_2(tmp_path, args, says):
    proc = subprocess.run([sys.executable, "bench/kim_protocol.py", "--out",
                           str(tmp_path / "out"), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and says in lines[0], proc.stderr
    assert not (tmp_path / "out").exists()


def test_cli_missing_out_is_one_error_line():
    proc = subprocess.run([sys.executable, "bench/kim_protocol.py"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("error:") and len(proc.stderr.strip().splitlines()) == 1
