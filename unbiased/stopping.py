"""A label-free stopping rule: the paper's lowest-MI selection applied over the epochs of one
run instead of over lambdas.

Every epoch, mi_eval (a fresh statistics network on the frozen training features) and the
training accuracy are recorded. The chosen epoch is the one with the lowest mi_eval among the
epochs whose training accuracy is within `tolerance` of the run's best (so an epoch that has
not fitted the task yet cannot win by knowing nothing); ties go to the later epoch. Neither test
labels nor unbiased validation data are used.
"""

from __future__ import annotations

from dataclasses import dataclass

SELECT_EPOCH_RULES: tuple[str, ...] = ("last", "lowest_mi")
EPOCH_TOLERANCE = 0.05  # the same train-accuracy slack as analysis' LowestMI over lambdas
_TIE = 1e-9


@dataclass(frozen=True)
class EpochRecord:
    epoch: int
    train_acc: float
    mi_eval: float


def pick_epoch(records: list[EpochRecord], tolerance: float = EPOCH_TOLERANCE) -> int:
    """The epoch the lowest-MI rule chooses among `records` (at least one)."""
    if not records:
        raise ValueError("pick_epoch needs at least one epoch record")
    best_acc = max(r.train_acc for r in records)
    fits = [r for r in records if r.train_acc >= best_acc - tolerance - 1e-12]
    lowest = min(r.mi_eval for r in fits)
    return max(r.epoch for r in fits if r.mi_eval <= lowest + _TIE)


def could_be_picked(records: list[EpochRecord]) -> set[int]:
    """Epochs that some later history could still make `pick_epoch` choose: those no other
    epoch dominates (a later-or-equal epoch with train_acc >= and mi_eval <= would win
    whenever this one is eligible). Only their weights need keeping."""
    keep = set()
    for r in records:
        dominated = any(o.epoch > r.epoch and o.train_acc >= r.train_acc
                        and o.mi_eval <= r.mi_eval + _TIE for o in records)
        if not dominated:
            keep.add(r.epoch)
    return keep
