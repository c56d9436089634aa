"""IMDB faces (IMDB-WIKI `imdb_crop`), the paper's Table 2: gender without the age bias.

Cleaning (`load_index`) drops a row without a face, with a second face, without gender, with
an age outside 0..100 (the release's README: `datevec(datenum(photo_taken,7,1)-dob)`), or
whose file is missing or unreadable.

Splits (`build_splits`). Alvi et al.'s exact construction is not public; ours is
deterministic and uses two hash orders, blake2b of the celebrity id and of the image path:
1. A celebrity is a *test identity* when its hash falls in the lowest 20% of the hash range,
   so the test set shares no person with EB1 or EB2.
2. Test: images of test identities, any age and gender (the paper's "unrestricted"), the
   first 22,468 in image-hash order.
3. EB1: the other identities' women aged 0-29 and men aged 40+; EB2: men aged 0-29 and women
   aged 40+ (the paper's "0-30" read as [0, 30), so no 5-year age bin is shared between the
   young and the old). Each is cut to the first 36,003 / 16,799 images in image-hash order.
4. Training subsets (`train_subset`): the first N images in image-hash order, every seed.

Labels: y = gender (1 male, as imdb.mat); c = age in 5-year bins, one-hot, 21-d. Inputs:
torchvision's ImageNet evaluation preprocessing, the same every epoch.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import math
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from unbiased.data import Benchmark, DataError, LoaderSplit, SplitOutputs
from unbiased.metrics import accuracy
from unbiased.models import ResNetFeatures

DOWNLOAD_URL = "https://data.vision.ee.ethz.ch/cvl/rrothe/imdb-wiki/"
MAT_FILE = "imdb.mat"
CROP_DIR = "imdb_crop"
SPLITS: tuple[str, ...] = ("EB1", "EB2")
# The paper's sizes (Section 4.2): EB1, EB2 and the test set.
PAPER_SIZES: dict[str, int] = {"EB1": 36_003, "EB2": 16_799, "test": 22_468}
YOUNG_MAX_AGE = 29  # "0-30": ages 0..29
OLD_MIN_AGE = 40  # "older than 40": 40 and up
MIN_AGE, MAX_AGE = 0, 100
BIN_YEARS = 5
C_DIM = MAX_AGE // BIN_YEARS + 1  # 21 bins: 0-4, ..., 100-104
TEST_IDENTITY_FRACTION = 0.2
NUM_CLASSES = 2
Z_DIM = 128
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# Matlab datenum of 1 Jan of year 1 (year 0 is a leap year of 366 days): ordinal offset.
_MATLAB_YEAR0_DAYS = 366
_EXAMPLES = 3  # file names quoted per problem in the report


@dataclass
class LoadReport:
    source: str
    rows: int = 0
    no_face: int = 0
    second_face: int = 0
    no_gender: int = 0
    bad_age: int = 0
    missing_files: int = 0
    unreadable_files: int = 0
    kept: int = 0
    missing_examples: list[str] = field(default_factory=list)
    unreadable_examples: list[str] = field(default_factory=list)

    def summary(self) -> str:
        text = (f"{self.source}: {self.rows:,} rows; dropped {self.no_face:,} without a face, "
                f"{self.second_face:,} with a second face, {self.no_gender:,} without gender, "
                f"{self.bad_age:,} with an implausible age, {self.missing_files:,} missing "
                f"files, {self.unreadable_files:,} unreadable files; kept {self.kept:,}")
        for what, examples in (("missing", self.missing_examples),
                               ("unreadable", self.unreadable_examples)):
            if examples:
                text += f" ({what}, e.g. {', '.join(examples)})"
        return text


@dataclass(frozen=True)
class ImdbIndex:
    """The usable images: small arrays, cheap to ship to every trial."""

    root: str  # the folder holding imdb.mat; full_path is relative to it
    path: np.ndarray  # (N,) str
    age: np.ndarray  # (N,) int64
    male: np.ndarray  # (N,) bool: y = 1
    celeb_id: np.ndarray  # (N,) int64
    report: LoadReport

    def __len__(self) -> int:
        return len(self.path)


def find_mat(root: str | os.PathLike | None) -> Path:
    if root is None:
        raise DataError(f"IMDB needs --root: the folder of the IMDB-WIKI {CROP_DIR} release "
                        f"(faces only) from {DOWNLOAD_URL}")
    base = Path(root).expanduser()
    for candidate in (base / MAT_FILE, base / CROP_DIR / MAT_FILE):
        if candidate.is_file():
            return candidate
    raise DataError(f"{MAT_FILE} not found in {base} or {base / CROP_DIR}: download "
                    f"{CROP_DIR}.tar (faces only) from {DOWNLOAD_URL} and extract it there")


def _column(struct: np.void, name: str, path: Path) -> np.ndarray:
    try:
        return np.asarray(struct[name]).ravel()
    except (ValueError, KeyError, IndexError):
        raise DataError(f"{path} has no field {name!r} in its 'imdb' struct: not the "
                        f"IMDB-WIKI metadata file") from None


def _text(cell: object) -> str:
    """A Matlab char array inside a cell, as loadmat returns it -> str."""
    values = np.asarray(cell).ravel()
    return str(values[0]) if values.size else ""


def read_mat(path: Path) -> dict[str, np.ndarray]:
    from scipy.io import loadmat
    from scipy.io.matlab import MatReadError

    try:
        mat = loadmat(str(path))
        struct = mat["imdb"][0, 0]
    except (MatReadError, OSError, ValueError, NotImplementedError, KeyError, TypeError,
            IndexError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DataError(f"cannot read {path} as the IMDB-WIKI metadata (a Matlab struct "
                        f"'imdb'): {first}") from None
    cols = {name: _column(struct, name, path).astype(np.float64)
            for name in ("dob", "photo_taken", "gender", "face_score", "second_face_score",
                         "celeb_id")}
    cols["full_path"] = np.array([_text(c) for c in _column(struct, "full_path", path)],
                                 dtype=object)
    sizes = {k: len(v) for k, v in cols.items()}
    if len(set(sizes.values())) != 1:
        raise DataError(f"{path}: per-image fields differ in length: {sizes}")
    return cols


def matlab_age(dob: np.ndarray, photo_taken: np.ndarray) -> np.ndarray:
    """Age in whole years on 1 July of `photo_taken` (the authors' mid-year convention) of
    a person born on the Matlab datenum `dob`; NaN where dob is no valid date."""
    ages = np.full(len(dob), np.nan)
    for i, (d, taken) in enumerate(zip(dob, photo_taken, strict=True)):
        if not (math.isfinite(d) and math.isfinite(taken)):
            continue
        ordinal = int(math.floor(d)) - _MATLAB_YEAR0_DAYS
        if not 1 <= ordinal <= dt.date.max.toordinal():
            continue
        born = dt.date.fromordinal(ordinal)
        ages[i] = int(taken) - born.year - (1 if (born.month, born.day) > (7, 1) else 0)
    return ages


def age_bins(age: np.ndarray) -> torch.Tensor:
    bins = np.clip(np.asarray(age, dtype=np.int64) // BIN_YEARS, 0, C_DIM - 1)
    return torch.nn.functional.one_hot(torch.from_numpy(bins), C_DIM).float()


def _readable(path: str) -> bool:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            width, height = im.size
        return width > 0 and height > 0
    except (OSError, UnidentifiedImageError, ValueError):
        return False


def load_index(root: str | os.PathLike | None) -> ImdbIndex:
    """imdb.mat cleaned (module docstring); the files are checked on 8 threads (I/O bound)."""
    mat_path = find_mat(root)
    cols = read_mat(mat_path)
    report = LoadReport(source=str(mat_path), rows=len(cols["dob"]))
    age = matlab_age(cols["dob"], cols["photo_taken"])
    keep = np.ones(report.rows, dtype=bool)
    for reason, bad in (("no_face", np.isneginf(cols["face_score"])),
                        ("second_face", ~np.isnan(cols["second_face_score"])),
                        ("no_gender", np.isnan(cols["gender"])),
                        ("bad_age", ~((age >= MIN_AGE) & (age <= MAX_AGE)))):
        setattr(report, reason, int((keep & bad).sum()))
        keep &= ~bad
    folder = mat_path.parent
    rows = np.flatnonzero(keep)
    files = [str(folder / p) for p in cols["full_path"][rows]]
    exists = np.array([os.path.isfile(f) for f in files], dtype=bool)
    report.missing_files = int((~exists).sum())
    report.missing_examples = list(cols["full_path"][rows[~exists]][:_EXAMPLES])
    present = rows[exists]
    with ThreadPoolExecutor(max_workers=8) as pool:
        readable = np.array(list(pool.map(_readable, [str(folder / p) for p in
                                                      cols["full_path"][present]])), dtype=bool)
    report.unreadable_files = int((~readable).sum())
    report.unreadable_examples = list(cols["full_path"][present[~readable]][:_EXAMPLES])
    rows = present[readable]
    report.kept = len(rows)
    if report.kept == 0:
        raise DataError(f"no usable image in {mat_path}: {report.summary()}")
    return ImdbIndex(root=str(folder), path=cols["full_path"][rows].astype(str),
                     age=age[rows].astype(np.int64), male=cols["gender"][rows] == 1,
                     celeb_id=cols["celeb_id"][rows].astype(np.int64), report=report)


def _hash01(text: str) -> float:
    """A stable number in [0, 1) for `text` (blake2b; not Python's salted hash)."""
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0 ** 64


def _hash_order(index: ImdbIndex, rows: np.ndarray) -> np.ndarray:
    keys = np.array([_hash01(f"image:{index.path[r]}") for r in rows])
    return rows[np.argsort(keys, kind="stable")]


@dataclass(frozen=True)
class ImdbSplits:
    """Row indices into an ImdbIndex; `pools`: the sizes before the cut."""

    rows: dict[str, np.ndarray]  # "EB1", "EB2", "test"
    pools: dict[str, int]


def eb_masks(index: ImdbIndex) -> dict[str, np.ndarray]:
    young = index.age <= YOUNG_MAX_AGE
    old = index.age >= OLD_MIN_AGE
    female = ~index.male
    return {"EB1": (female & young) | (index.male & old),
            "EB2": (index.male & young) | (female & old)}


def build_splits(index: ImdbIndex, sizes: dict[str, int | None] | None = None) -> ImdbSplits:
    """EB1, EB2 and the test set (module docstring), capped by `sizes` (None: uncapped)."""
    sizes = dict(PAPER_SIZES) if sizes is None else sizes
    ids = np.unique(index.celeb_id)
    test_ids = ids[np.array([_hash01(f"celeb:{i}") < TEST_IDENTITY_FRACTION for i in ids],
                            dtype=bool)]
    is_test = np.isin(index.celeb_id, test_ids)
    pools = {**{name: np.flatnonzero(~is_test & mask) for name, mask in eb_masks(index).items()},
             "test": np.flatnonzero(is_test)}
    rows = {name: _hash_order(index, pool)[:sizes.get(name)] for name, pool in pools.items()}
    return ImdbSplits(rows, {k: len(v) for k, v in pools.items()})


def describe_splits(splits: ImdbSplits) -> str:
    return "IMDB splits: " + ", ".join(
        f"{name} {len(splits.rows[name]):,} (paper {PAPER_SIZES[name]:,}; pool "
        f"{splits.pools[name]:,})" for name in ("EB1", "EB2", "test"))


def imagenet_transform(image_size: int = 224):
    """torchvision's ImageNet evaluation preprocessing, for any crop size."""
    from torchvision import transforms

    return transforms.Compose([
        transforms.Resize(round(image_size * 256 / 224)),
        transforms.CenterCrop(image_size),
        transforms.ToTensor(),
        transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD),
    ])


class FaceImages(Dataset):
    def __init__(self, folder: str, paths: Sequence[str], image_size: int = 224):
        self.folder = folder
        self.paths = list(paths)
        self.transform = imagenet_transform(image_size)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> torch.Tensor:
        from PIL import Image

        path = os.path.join(self.folder, self.paths[i])
        try:
            with Image.open(path) as im:
                return self.transform(im.convert("RGB"))
        except OSError as exc:
            raise DataError(f"cannot decode {path}: {exc}") from None


def _split(index: ImdbIndex, rows: np.ndarray, image_size: int, num_workers: int
           ) -> LoaderSplit:
    y = torch.from_numpy(index.male[rows].astype(np.int64))
    c = age_bins(index.age[rows])
    return LoaderSplit(FaceImages(index.root, index.path[rows], image_size), y, c,
                       num_workers=num_workers)


def eval_name(split: str) -> str:
    return f"acc_{split.lower()}"


def _test_acc(outs: dict[str, SplitOutputs]) -> dict[str, float]:
    # The contract's test_acc is the accuracy on the unrestricted test set.
    out = outs[eval_name("test")]
    return {"test_acc": accuracy(out.pred, out.y)}


def build(index: ImdbIndex, train_split: str, *, splits: ImdbSplits | None = None,
          train_subset: int | None = None, max_eval: int | None = None,
          arch: str = "resnet50", weights_path: str | None = None, z_dim: int = Z_DIM,
          image_size: int = 224, num_workers: int = 0) -> Benchmark:
    """Train on EB1 or EB2; evaluate on the other and the test set (also test_acc)."""
    if train_split not in SPLITS:
        raise ValueError(f"train_split must be one of {SPLITS}, got {train_split!r}")
    splits = splits if splits is not None else build_splits(index)
    train_rows = splits.rows[train_split][:train_subset]
    if len(train_rows) < 2:
        raise DataError(f"IMDB split {train_split} has {len(train_rows)} usable images "
                        f"({describe_splits(splits)}): too few to train")
    other = SPLITS[1 - SPLITS.index(train_split)]
    evals = {eval_name(name): _split(index, splits.rows[name][:max_eval], image_size,
                                     num_workers)
             for name in (other, "test")}
    return Benchmark(
        name="imdb", train=_split(index, train_rows, image_size, num_workers),
        eval_splits=evals, num_classes=NUM_CLASSES,
        make_features=lambda: ResNetFeatures(arch, z_dim, weights_path), z_dim=z_dim,
        c_dim=C_DIM, extra_metrics=[_test_acc], bias_classes=(C_DIM,),
        info={"source": index.root, "train_split": train_split, "n_train": len(train_rows),
              **{f"n_{k}": len(v) for k, v in evals.items()}, "arch": arch,
              "weights": weights_path or "none"})
