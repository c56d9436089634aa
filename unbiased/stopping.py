"""A label-free stopping rule: the paper's lowest-MI selection over the epochs of one run
instead of over lambdas: the lowest estimate among the eligible epochs, ties to the later.
An epoch is eligible when

- its training accuracy is within `tolerance` of the run's best (an epoch that has not fitted
  the task yet cannot win by knowing nothing);
- its estimate and its training accuracy are finite;
- neither estimate is below its floor by more than `FLOOR_MARGIN_NATS`. The floor is the same
  estimator on the model's one-hot predictions, a function of z, so I(z; c) >= I(pred; c):
  an estimate well below it is the estimator failing on z (mi_eval ~0 against a floor of
  ~1.6-1.9; docs/MEASURED.md, "The same trained models"), not a debiased model.

Eligibility, the tie rule and `could_be_picked` use the same exact comparisons, so an epoch
whose weights were dropped can never be chosen later.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SELECT_EPOCH_RULES: tuple[str, ...] = ("last", "lowest_mi", "lowest_mi_cond")
CRITERION = {"lowest_mi": "mi_eval", "lowest_mi_cond": "mi_eval_cond"}
EPOCH_TOLERANCE = 0.05  # the same train-accuracy slack as analysis' LowestMI over lambdas
_FIT_EPS = 1e-12  # float slack on the train-accuracy tolerance
# How far below the prediction floor an estimate may read before it counts as an estimator
# failure: mi_eval's spread at one model is up to about +-0.3 nats (docs/MEASURED.md, "The
# same trained models" and "The label-free rule: which estimate it minimises").
FLOOR_MARGIN_NATS = 0.5


@dataclass(frozen=True)
class EstimatedEpoch:
    epoch: int
    train_acc: float
    mi_eval: float
    mi_eval_cond: float = math.nan
    # The estimators on the model's one-hot predictions (NaN: not measured, no check).
    floor: float = math.nan
    floor_cond: float = math.nan

    def value(self, criterion: str) -> float:
        return float(getattr(self, criterion))

    def estimator_failed(self) -> bool:
        """Either estimate below its floor by more than the margin. Both probe the same z, so
        one failing discredits the other: on seed 7's failed epochs mi_eval read ~0 against a
        ~1.9 floor while mi_eval_cond read ~0 against a floor of ~0, indistinguishable from a
        debiased model by itself."""
        return any(math.isfinite(floor) and value < floor - FLOOR_MARGIN_NATS
                   for value, floor in ((self.mi_eval, self.floor),
                                        (self.mi_eval_cond, self.floor_cond)))

    def usable(self, criterion: str) -> bool:
        return (math.isfinite(self.train_acc) and math.isfinite(self.value(criterion))
                and not self.estimator_failed())


def _eligible(records: list[EstimatedEpoch], criterion: str, tolerance: float
              ) -> list[EstimatedEpoch]:
    usable = [r for r in records if r.usable(criterion)]
    if not usable:
        return []
    best_acc = max(r.train_acc for r in usable)
    return [r for r in usable if r.train_acc >= best_acc - tolerance - _FIT_EPS]


def pick_epoch(records: list[EstimatedEpoch], tolerance: float = EPOCH_TOLERANCE,
               criterion: str = "mi_eval") -> int | None:
    """The epoch the rule chooses, or None when no epoch is usable."""
    if not records:
        raise ValueError("pick_epoch needs at least one epoch record")
    fits = _eligible(records, criterion, tolerance)
    if not fits:
        return None
    lowest = min(r.value(criterion) for r in fits)
    return max(r.epoch for r in fits if r.value(criterion) == lowest)


def could_be_picked(records: list[EstimatedEpoch], criterion: str = "mi_eval") -> set[int]:
    """Epochs some later history could still make `pick_epoch` choose: usable ones no later
    epoch dominates (train_acc >= and an estimate <=). Only their weights need keeping."""
    usable = [r for r in records if r.usable(criterion)]
    return {r.epoch for r in usable
            if not any(o.epoch > r.epoch and o.train_acc >= r.train_acc
                       and o.value(criterion) <= r.value(criterion) for o in usable)}
