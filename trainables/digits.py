"""Colored MNIST's trainable: the generic one (trainables/benchmark.py) bound to it.

Use through `tune.with_parameters(train_digits, digits=grey_digits)` so the grey digits are put
in the object store once per sweep; without it each trial reads its own copy.
"""

from __future__ import annotations

from trainables.benchmark import trainable_for
from unbiased.benchmarks.digits import build as build_digits

__all__ = ["build_digits", "train_digits"]

train_digits = trainable_for("digits")
