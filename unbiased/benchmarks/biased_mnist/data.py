"""Biased MNIST's data (the protocol: spec.py's docstring), from Colored MNIST's grey digits.
torch is imported inside the functions: the spec reads this module without torch.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from unbiased.benchmarks.spec import build_device

if TYPE_CHECKING:
    import torch

    from unbiased.benchmarks.digits.data import GreyDigits
    from unbiased.data import Benchmark, Split, TensorSplit

NUM_CLASSES = 10
# Background colour of each class, 0-255 RGB (ReBias's COLOUR_MAP).
COLOURS = ((255, 0, 0), (0, 255, 0), (0, 0, 255), (225, 225, 0), (225, 0, 225),
           (0, 255, 255), (255, 128, 0), (255, 0, 128), (128, 0, 255), (128, 128, 128))
UNBIASED_RHO = 0.1


def colour_classes(y: torch.Tensor, rho: float, gen: torch.Generator) -> torch.Tensor:
    import torch

    if not 0 <= rho <= 1:
        raise ValueError(f"rho must be in [0, 1], got {rho}")
    out = torch.empty_like(y)
    for label in range(NUM_CLASSES):
        rows = torch.nonzero(y == label).squeeze(1)
        rows = rows[torch.randperm(len(rows), generator=gen)]
        keep = int(len(rows) * rho)
        out[rows[:keep]] = label
        rest = rows[keep:]
        if len(rest) == 0:
            continue
        chunk = math.ceil(len(rest) / (NUM_CLASSES - 1))
        others = [(label + k) % NUM_CLASSES for k in range(1, NUM_CLASSES)]
        order = torch.randperm(len(others), generator=gen).tolist()
        for i, piece in enumerate(rest.split(chunk)):
            out[piece] = others[order[i]]
    return out


def colourise(grey: torch.Tensor, colour_idx: torch.Tensor) -> torch.Tensor:
    import torch

    palette = torch.tensor(COLOURS, dtype=grey.dtype, device=grey.device) / 255.0
    digit = (grey > 0).unsqueeze(1)
    background = palette[colour_idx.to(grey.device)][:, :, None, None]
    return torch.where(digit, torch.ones((), dtype=grey.dtype, device=grey.device),
                       background.expand(-1, -1, *grey.shape[1:]))


def make_split(grey: torch.Tensor, y: torch.Tensor, rho: float, gen: torch.Generator,
               device: torch.device | str | None = None) -> TensorSplit:
    import torch

    from unbiased.data import TensorSplit

    idx = colour_classes(y, rho, gen)
    if device is not None:
        grey, y, idx = grey.to(device), y.to(device), idx.to(device)
    c = torch.nn.functional.one_hot(idx, NUM_CLASSES).float()
    return TensorSplit(colourise(grey, idx), y, c)


def colour_only_accuracy(digits: GreyDigits, rho: float, seed: int) -> float:
    """Bias strength: what a classifier of the background colour alone gets right."""
    import torch

    idx = colour_classes(digits.train_y, rho, torch.Generator().manual_seed(seed))
    counts = torch.zeros(NUM_CLASSES, NUM_CLASSES, dtype=torch.long)
    counts.index_put_((idx, digits.train_y), torch.ones_like(idx), accumulate=True)
    return float(counts.amax(dim=1).sum()) / max(len(idx), 1)


def digit_colour_groups(split: Split) -> tuple[torch.Tensor, int]:
    from unbiased.data import bias_groups

    return bias_groups(split.y, split.c, NUM_CLASSES, (NUM_CLASSES,))


def build(digits: GreyDigits, rho: float, seed: int, z_dim: int = 64,
          device: torch.device | str | None = None, z_relu: bool = False,
          width: int = 64) -> Benchmark:
    import torch

    from unbiased.data import Benchmark
    from unbiased.models import LeNetFeatures

    if not 0 < rho <= 1:
        raise ValueError(f"rho must be in (0, 1], got {rho}")
    gen = torch.Generator().manual_seed(seed)
    train = make_split(digits.train_x, digits.train_y, rho, gen, device)
    test = make_split(digits.test_x, digits.test_y, UNBIASED_RHO, gen, device)
    biased = make_split(digits.test_x, digits.test_y, 1.0, gen, device)
    return Benchmark(
        name="biased_mnist", train=train,
        eval_splits={"test_acc": test, "biased_acc": biased}, num_classes=NUM_CLASSES,
        make_features=lambda: LeNetFeatures(z_dim, z_relu=z_relu, width=width), z_dim=z_dim,
        c_dim=NUM_CLASSES, bias_classes=(NUM_CLASSES,), report_groups=digit_colour_groups,
        info={"source": digits.source, "rho": rho, "n_train": len(train),
              "n_test": len(test)})


def build_trial(config: dict, digits: GreyDigits | None = None) -> Benchmark:
    if digits is None:
        from unbiased.benchmarks.digits.data import load_grey_digits

        digits = load_grey_digits(config.get("source", "mnist5k"), config.get("root"))
    return build(digits, float(config["rho"]), int(config["seed"]),
                 z_dim=int(config.get("z_dim", 64)), device=build_device(config),
                 z_relu=bool(config.get("z_relu", False)), width=int(config.get("width", 64)))
