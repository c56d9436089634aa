"""Ray Tune function trainable for German credit.

The table is tiny (1000 rows), so each trial builds its own benchmark (split + scaling for its
seed) inside the trial. Use through `tune.with_parameters(train_german, table=table)` so the
file is parsed once by the driver; without it each trial reads `root` (or the shipped copy).
"""

from __future__ import annotations

from trainables.common import run_trial
from unbiased.benchmarks import german
from unbiased.benchmarks.german import GermanTable
from unbiased.data import Benchmark


def build_german(config: dict, table: GermanTable | None = None) -> Benchmark:
    return german.build(int(config["seed"]), config.get("root"), table=table)


def train_german(config: dict, table: GermanTable | None = None) -> None:
    """Config keys: method and its config fields (unbiased/methods), seed, epochs, device,
    num_threads, mi_eval_steps, select_epoch (trainables/common.py); root (the build);
    fail_once_at_epoch (tests only)."""
    run_trial(config, lambda cfg: build_german(cfg, table))
