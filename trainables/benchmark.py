"""The one Ray Tune function trainable of every registered benchmark.

A trial trains on `SPEC.build(config, **loaded)` of its benchmark (unbiased.benchmarks), where
`loaded` is what the driver's `SPEC.load` read once and `tune.with_parameters` put in the
object store; without it a build reads its own data. Everything else is run_trial's, or
run_bundle's for a trial of several grid points (`--bundle`, trainables/bundle.py).
"""

from __future__ import annotations

from collections.abc import Callable

from trainables.bundle import MEMBERS_KEY, run_bundle
from trainables.common import run_trial
from unbiased.benchmarks import benchmark_spec
from unbiased.settings import flat_config


def train_benchmark(config: dict, **loaded: object) -> None:
    """Config keys: benchmark (a registered name); method and its config fields
    (unbiased/methods), seed, epochs, device, num_threads, mi_eval_steps, select_epoch
    (trainables/common.py); the benchmark's data axes and build keys (its SPEC);
    fail_once_at_epoch (tests only)."""
    trainable_for(str(config["benchmark"]))(config, **loaded)


def trainable_for(name: str) -> Callable[..., None]:
    """train_benchmark bound to one benchmark, named `train_<name>`: Tune names a sweep's
    trials after its trainable, and a sweep keeps the names it had (a --resume of a sweep
    started before finds its trials)."""
    spec = benchmark_spec(name)

    def train(config: dict, **loaded: object) -> None:
        run = run_bundle if MEMBERS_KEY in flat_config(config) else run_trial
        run(config, lambda cfg: spec.build(cfg, **loaded))

    train.__name__ = train.__qualname__ = f"train_{name}"
    return train
