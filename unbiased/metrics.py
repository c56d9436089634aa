"""Metrics beyond accuracy. Equality of opportunity (Hardt et al., 2016) is the paper's
fairness metric on German credit: |TPR(young) - TPR(not young)|, lower is fairer.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from unbiased.data import SplitOutputs

ArrayLike = torch.Tensor | np.ndarray
EO_SPLIT = "test_acc"  # the evaluation split EO is reported on (the benchmark's test split)
POSITIVE = 1  # y = 1 is good credit


def _flat(values: ArrayLike) -> torch.Tensor:
    return torch.as_tensor(values).detach().cpu().reshape(-1)


def accuracy(pred: ArrayLike, y: ArrayLike) -> float:
    pred, y = _flat(pred), _flat(y)
    return float((pred == y).float().mean()) if len(y) else math.nan


def true_positive_rate(pred: ArrayLike, y: ArrayLike, positive: int = POSITIVE) -> float:
    """P(pred = positive | y = positive); NaN when there is no positive row (undefined, not 0,
    so an empty group cannot pass as perfectly unfair or fair)."""
    pred, y = _flat(pred), _flat(y)
    positives = y == positive
    if not bool(positives.any()):
        return math.nan
    return float((pred[positives] == positive).float().mean())


def equality_of_opportunity(pred: ArrayLike, y: ArrayLike, sensitive: ArrayLike) -> float:
    """|TPR(sensitive) - TPR(not sensitive)|; NaN if a group has no positive row."""
    pred, y = _flat(pred), _flat(y)
    group = _flat(sensitive).bool()
    if not len(pred) == len(y) == len(group):
        raise ValueError(f"lengths differ: pred {len(pred)}, y {len(y)}, "
                         f"sensitive {len(group)}")
    tpr_in = true_positive_rate(pred[group], y[group])
    tpr_out = true_positive_rate(pred[~group], y[~group])
    return abs(tpr_in - tpr_out)


def eo_metric(outs: dict[str, SplitOutputs]) -> dict[str, float]:
    out = outs[EO_SPLIT]
    return {"eo": equality_of_opportunity(out.pred, out.y, out.c[:, 0] > 0.5)}
