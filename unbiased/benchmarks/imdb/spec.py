"""IMDB faces (the paper's Table 2) as a registered benchmark."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from unbiased.benchmarks.spec import (
    PAPER,
    SMOKE,
    BenchmarkSpec,
    Column,
    Protocol,
    PublishedRow,
    TableSpec,
)
from unbiased.settings import setting

if TYPE_CHECKING:
    from unbiased.benchmarks.imdb.data import ImdbIndex, ImdbSplits
    from unbiased.data import Benchmark

TRAIN_SPLITS = ("EB1", "EB2")


@dataclass
class ImdbSettings:
    train_split: tuple[str, ...] = setting(
        TRAIN_SPLITS, "training splits, comma-separated: EB1 (women 0-29, men 40+), EB2 "
                      "(men 0-29, women 40+)", choices=TRAIN_SPLITS, many=True,
        convert=str.upper)
    weights: str = setting(
        "imagenet", "backbone weights: 'imagenet' (torchvision's, from the torch hub cache, "
                    "downloaded once), 'none' (random init) or a state_dict PATH")
    arch: str = setting("resnet50", "backbone (the paper's is resnet50; resnet18 for fast "
                                    "checks)", choices=("resnet50", "resnet18"))
    train_subset: int = setting(
        0, "train on the first N images of the split (paper: 2000); 0 = all", ge=0)
    max_eval: int = setting(0, "evaluate on at most N images per evaluation split; 0 = all",
                            ge=0)
    num_workers: int = setting(0, "DataLoader worker processes per trial decoding JPEGs", ge=0)
    image_size: int = setting(224, "input crop size (ImageNet: 224)", ge=1)


IMDB: dict[str, dict[str, object]] = {
    # A CPU smoke run. lr 1e-4: 2 epochs of 10 steps barely move at the paper's 1e-5.
    # `batch` inner z: K forwards of a ResNet-50 per step would dominate a CPU run.
    "quick": {
        "train_split": ["EB1", "EB2"], "lam": [0.0, 0.9], "seeds": [0], "K": 20, "epochs": 2,
        "batch_size": 24, "lr": 1e-4, "mine_lr": 0.1, "mine_optimizer": "sgd",
        "inner_z": "batch", "arch": "resnet50", "weights": "imagenet", "image_size": 224,
        "train_subset": 240, "max_eval": 240, "num_workers": 0, "eval_batch_size": 48,
        "cpus_per_trial": 1.0, "gpus_per_trial": 0.0, "mi_eval_steps": 500,
    },
    # Section 4.2 and the supplementary; lam 0.1 and 1.0 besides the paper's for the
    # selection rules.
    "paper": {
        "train_split": ["EB1", "EB2"], "lam": [0.0, 0.1, 0.5, 0.9, 1.0], "seeds": [0, 1, 2],
        "K": 40, "epochs": 6, "batch_size": 24, "lr": 1e-5, "mine_lr": 0.1,
        "mine_optimizer": "sgd", "inner_z": "fresh", "arch": "resnet50", "weights": "imagenet",
        "image_size": 224, "train_subset": 2000, "max_eval": 0, "num_workers": 6,
        "eval_batch_size": 256, "cpus_per_trial": 8.0, "gpus_per_trial": 1.0,
        "device": "cuda", "mi_eval_steps": 2000,
    },
}

# Table 2: IMDB, train on EB1 / EB2, evaluate on the other split and on the test set.
COLUMNS: tuple[str, ...] = ("EB1→EB2", "EB1→Test", "EB2→EB1", "EB2→Test")
PAPER_LAMBDA: dict[str, float] = {"EB1": 0.5, "EB2": 0.9}
_NAN = float("nan")
PUBLISHED: tuple[PublishedRow, ...] = tuple(
    PublishedRow(row, dict(zip(COLUMNS, values, strict=True)), f"{PAPER}, Table 2")
    for row, values in (
        ("ERM (λ=0)", ((.650, .020), (.849, .007), (.576, .013), (.708, .008))),
        ("Alvi et al.", ((.637, _NAN), (.856, _NAN), (.573, _NAN), (.699, _NAN))),
        ("Kim et al.", ((.680, _NAN), (.867, _NAN), (.642, _NAN), (.745, _NAN))),
        ("Ours (λ=0.5 / 0.9)", ((.684, .010), (.872, .010), (.631, .036), (.745, .022))),
    ))


def _column(train: str, on: str, metric: tuple[str, ...]) -> Column:
    return Column(f"{train}→{on}", metric, (("train_split", train),), PAPER_LAMBDA[train])


# The test split's accuracy is `acc_test` where the trainable reports one, else `test_acc`.
_TEST = ("acc_test", "test_acc")
TABLE = TableSpec(
    benchmark="imdb", name="IMDB faces", table="Table 2", measures="accuracy",
    columns=(_column("EB1", "EB2", ("acc_eb2",)), _column("EB1", "Test", _TEST),
             _column("EB2", "EB1", ("acc_eb1",)), _column("EB2", "Test", _TEST)),
    published=PUBLISHED, paper_row="Ours (λ=0.5 on EB1, 0.9 on EB2, as the paper)",
    note="A→B: trained on split A, accuracy on B (Test: `{metric[EB1→Test]}`).",
    requires=("train_split",),
    protocol=Protocol(
        comparable=frozenset({"paper"}),
        notes={"quick": "{preset} preset: {train_subset} training images, {epochs} epochs "
                        + SMOKE}),
)


def load(values: dict) -> tuple[dict[str, object], str]:
    """User-side failures come here, before Ray starts; sets `weights_path` in `values`."""
    from unbiased.benchmarks.imdb import data as imdb_faces
    from unbiased.data import DataError
    from unbiased.models import resolve_imagenet_weights

    index = imdb_faces.load_index(values.get("root"))
    weights_path = resolve_imagenet_weights(str(values["arch"]), str(values["weights"]))
    splits = imdb_faces.build_splits(index)
    print(index.report.summary(), flush=True)
    print(imdb_faces.describe_splits(splits), flush=True)
    subset = int(values["train_subset"] or 0)
    for name in values["train_split"]:
        if min(len(splits.rows[name]), subset or len(splits.rows[name])) < 2:
            raise DataError(f"IMDB split {name} has {len(splits.rows[name])} usable "
                            f"images: too few to train")
    values["weights_path"] = weights_path or ""  # "" = random init
    return ({"index": index, "splits": splits},
            f"{values['arch']}, weights {weights_path or 'none'}, training subsets of "
            f"{subset or 'all'} images")


def fetch(values: dict) -> Iterator[str]:
    """`--fetch-data`: the weights downloaded, the faces checked (users fetch them)."""
    import os

    import torch

    from unbiased.benchmarks.imdb import data as imdb_faces
    from unbiased.data import DataError
    from unbiased.models import resolve_imagenet_weights

    arch, weights = str(values["arch"]), str(values["weights"])
    path = resolve_imagenet_weights(arch, weights)
    if path is None:
        yield "backbone weights: none (random init), nothing to fetch"
    elif weights == "imagenet":
        yield (f"ImageNet weights ({arch}): {path} ({os.path.getsize(path):,} bytes), in the "
               f"torch hub cache ({torch.hub.get_dir()}) where the sweep reads them; a node "
               f"that does not see it needs --weights PATH")
    else:
        yield f"backbone weights ({arch}): {path} ({os.path.getsize(path):,} bytes)"
    try:
        imdb_faces.find_mat(values.get("root"))
    except DataError as exc:
        raise DataError(f"this program does not download IMDB faces (get them by hand): "
                        f"{exc}") from None
    index = imdb_faces.load_index(values.get("root"))
    yield index.report.summary()
    yield imdb_faces.describe_splits(imdb_faces.build_splits(index))


def _optional(value: object) -> int | None:
    return int(value) if value else None


def build(config: dict, index: ImdbIndex | None = None,
          splits: ImdbSplits | None = None) -> Benchmark:
    """Without `index` and `splits` (a trial outside a sweep) it reads `root` itself."""
    from unbiased.benchmarks.imdb import data as imdb_faces
    from unbiased.models import resolve_imagenet_weights

    if index is None:
        index = imdb_faces.load_index(config.get("root"))
    arch = str(config.get("arch", "resnet50"))
    # The driver passes a resolved local file; a bare trial resolves (and caches) it here.
    weights_path = config.get("weights_path")
    if weights_path is None:
        weights_path = resolve_imagenet_weights(arch, config.get("weights", "imagenet"))
    return imdb_faces.build(index, str(config["train_split"]), splits=splits,
                      train_subset=_optional(config.get("train_subset")),
                      max_eval=_optional(config.get("max_eval")), arch=arch,
                      weights_path=weights_path or None,
                      z_dim=int(config.get("z_dim", imdb_faces.Z_DIM)),
                      image_size=int(config.get("image_size", 224)),
                      num_workers=int(config.get("num_workers", 0)))


SPEC = BenchmarkSpec(
    name="imdb", title="IMDB faces",
    description="IMDB faces grid (the paper's Table 2): train split {EB1, EB2} x lambda x K x "
                "seed.",
    presets=IMDB, data_axes=("train_split",), axis_labels={"train_split": "train {value}"},
    # weights_path: the file load resolved from `weights` (the trials never download).
    build_keys=("root", "arch", "image_size", "train_subset", "max_eval", "num_workers",
                "weights_path"),
    load=load, build=build, table=TABLE, settings=ImdbSettings, fetch=fetch,
    fetch_keys=("arch", "weights"),
    columns=("acc_eb1", "acc_eb2", "acc_test"),
    column_labels={"acc_eb1": "acc EB1", "acc_eb2": "acc EB2", "acc_test": "acc test"},
    summary=("train_acc", "acc_eb1", "acc_eb2", "acc_test"))
