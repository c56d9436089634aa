"""Ray Tune function trainable for IMDB faces (Table 2).

Use through `tune.with_parameters(train_imdb, index=index, splits=splits)` so imdb.mat is read
and the file checks run once in the driver; without them each trial reads `root` itself.
The JPEGs are decoded inside the trial by `num_workers` DataLoader processes.
"""

from __future__ import annotations

from trainables.common import run_trial
from unbiased.benchmarks import imdb
from unbiased.benchmarks.imdb import ImdbIndex, ImdbSplits
from unbiased.data import Benchmark
from unbiased.models import resolve_imagenet_weights


def _optional(value: object) -> int | None:
    """0 or None in a config means "no cap"."""
    return int(value) if value else None


def build_imdb(config: dict, index: ImdbIndex | None = None,
               splits: ImdbSplits | None = None) -> Benchmark:
    if index is None:
        index = imdb.load_index(config.get("root"))
    arch = str(config.get("arch", "resnet50"))
    # The driver passes a resolved local file; a bare trial resolves (and caches) it here.
    weights_path = config.get("weights_path")
    if weights_path is None:
        weights_path = resolve_imagenet_weights(arch, config.get("weights", "imagenet"))
    return imdb.build(index, str(config["train_split"]), splits=splits,
                      train_subset=_optional(config.get("train_subset")),
                      max_eval=_optional(config.get("max_eval")), arch=arch,
                      weights_path=weights_path or None,
                      z_dim=int(config.get("z_dim", imdb.Z_DIM)),
                      image_size=int(config.get("image_size", 224)),
                      num_workers=int(config.get("num_workers", 0)))


def train_imdb(config: dict, index: ImdbIndex | None = None,
               splits: ImdbSplits | None = None) -> None:
    """Config keys: method and its config fields (unbiased/methods), seed, epochs, device,
    num_threads, mi_eval_steps, select_epoch (trainables/common.py); train_split, arch,
    weights (imagenet | none | PATH) or weights_path (resolved; "" = none), image_size,
    train_subset, max_eval, num_workers, z_dim, root (the build); fail_once_at_epoch (tests
    only)."""
    run_trial(config, lambda cfg: build_imdb(cfg, index, splits))
