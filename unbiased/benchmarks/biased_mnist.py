"""Biased MNIST, the benchmark of Bahng et al., "Learning De-biased Representations with
Biased Representations" (ReBias, ICML 2020; their code: clovaai/rebias,
datasets/colour_mnist.py, MIT licence). The facts below carry over from there; the code is ours.

- Each digit class has a background colour (`COLOURS`, ReBias's ten). The digit itself is
  white: every pixel whose grey value is above 0 becomes (1, 1, 1); every other pixel takes
  the image's background colour.
- `rho`, the training set's colour-label correlation: of each class, a random int(n * rho)
  digits get the class's own colour; the rest is cut into chunks of ceil(rest / 9) that go to
  the nine other colours, one chunk each, in a random order.
- The test set is "unbiased" as in ReBias's tables: rho = 0.1, i.e. every colour about
  equally often in every class (`test_acc`). `biased_acc` is the test set at rho = 1, every
  digit on its own class's colour (ReBias's "Biased" column).
- c, the bias attribute: the background colour's index, one-hot (10-d).
- Where we differ from ReBias: pixels stay in [0, 1] (theirs are normalised to [-1, 1]), the
  feature extractor is our LeNet (theirs a stack of 7x7 convolutions), and everything random
  comes from one generator seeded by `seed` (theirs from numpy's global state, unseeded).

torch is imported inside the functions: analysis and the sweep drivers read this module's
presets and table spec without loading torch.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from unbiased.benchmarks.colored_mnist import GreyDigits
    from unbiased.data import Benchmark, TensorSplit

NUM_CLASSES = 10
# Background colour of each class, 0-255 RGB (ReBias's COLOUR_MAP).
COLOURS = ((255, 0, 0), (0, 255, 0), (0, 0, 255), (225, 225, 0), (225, 0, 225),
           (0, 255, 255), (255, 128, 0), (255, 0, 128), (128, 0, 255), (128, 128, 128))
PAPER_RHOS = (0.99, 0.995, 0.997, 0.999)
UNBIASED_RHO = 0.1


def colour_classes(y: torch.Tensor, rho: float, gen: torch.Generator) -> torch.Tensor:
    """Each digit's background colour index: per class, int(n * rho) digits in a random order
    keep the class's colour, the rest goes in chunks of ceil(rest / 9) to the other nine
    colours, in a random order of those."""
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
    """(N, 28, 28) grey in [0, 1] and background colour indices -> (N, 3, 28, 28): white
    digit on its background colour."""
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
    """Bias strength: the share of training digits whose class is the most frequent one on
    their background colour (what a classifier of the colour alone gets right)."""
    import torch

    idx = colour_classes(digits.train_y, rho, torch.Generator().manual_seed(seed))
    counts = torch.zeros(NUM_CLASSES, NUM_CLASSES, dtype=torch.long)
    counts.index_put_((idx, digits.train_y), torch.ones_like(idx), accumulate=True)
    return float(counts.amax(dim=1).sum()) / max(len(idx), 1)


def build(digits: GreyDigits, rho: float, seed: int, z_dim: int = 64,
          device: torch.device | str | None = None, z_relu: bool = False,
          width: int = 64) -> Benchmark:
    """The benchmark for one (rho, seed): the training set at `rho`, the test set at
    rho = 0.1 (`test_acc`) and at rho = 1 (`biased_acc`)."""
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
        c_dim=NUM_CLASSES, bias_classes=(NUM_CLASSES,),
        info={"source": digits.source, "rho": rho, "n_train": len(train),
              "n_test": len(test)})
