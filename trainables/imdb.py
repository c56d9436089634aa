"""IMDB faces' trainable: the generic one (trainables/benchmark.py) bound to it.

Use through `tune.with_parameters(train_imdb, index=index, splits=splits)` so imdb.mat is read
and the file checks run once in the driver; without them each trial reads `root` itself.
"""

from __future__ import annotations

from trainables.benchmark import trainable_for

train_imdb = trainable_for("imdb")
