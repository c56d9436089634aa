"""German credit's trainable: the generic one (trainables/benchmark.py) bound to it.

Use through `tune.with_parameters(train_german, table=table)` so the file is parsed once by
the driver; without it each trial reads `root` (or the shipped copy).
"""

from __future__ import annotations

from trainables.benchmark import trainable_for

train_german = trainable_for("german")
