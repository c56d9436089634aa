"""The hyperparameter distributions of an equal tuning budget, and the arms it compares.

Each method class declares the distributions of the settings it reads (`ERM.search`, merged
along its bases). An arm is a method with some settings held (resampling is ERM on the group
sampler). Plain data: nothing here imports torch or ray.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class LogUniform:
    low: float
    high: float

    def __post_init__(self) -> None:
        if not 0 < self.low < self.high:
            raise ValueError(f"LogUniform needs 0 < low < high, got {self.low}, {self.high}")


@dataclass(frozen=True)
class Choice:
    values: tuple[object, ...]

    def __post_init__(self) -> None:
        if not self.values:
            raise ValueError("Choice needs at least one value")


Space = LogUniform | Choice
# Significant digits of a drawn number: 0.000835, not 0.0008349172..., in configs and tables.
DIGITS = 3


@dataclass(frozen=True)
class Arm:
    """`method` with `held` fixed, the rest drawn (with lam held at 0: ERM's space)."""

    method: str
    label: str
    held: dict[str, object] = field(default_factory=dict)


# ERM's two arms run under group_reweight, whose lam 0 is ERM's step with nothing else trained.
ARMS: dict[str, Arm] = {
    "erm": Arm("group_reweight", "ERM", {"lam": 0.0, "sampler": "uniform"}),
    "resampling": Arm("group_reweight", "Resampling (ERM on group-balanced batches)",
                      {"lam": 0.0, "sampler": "groups"}),
    "reweighting": Arm("group_reweight", "Group reweighting", {"sampler": "uniform"}),
    "group_dro": Arm("group_dro", "Group DRO", {"lam": 1.0, "sampler": "groups"}),
    "ours": Arm("mi_backprop", "Ours", {"sampler": "uniform"}),
    "ours_balanced": Arm("mi_backprop", "Ours on balanced MI",
                         {"sampler": "uniform", "mi_weights": "groups"}),
    "ours_resampled": Arm("mi_backprop", "Ours on the group sampler", {"sampler": "groups"}),
    "lntl": Arm("lntl", "Kim et al. (LNTL)", {"sampler": "uniform"}),
}


def search_space(method_class: type) -> dict[str, Space]:
    space: dict[str, Space] = {}
    for cls in reversed(method_class.__mro__):
        space.update(cls.__dict__.get("search", {}))
    return space


def arm_space(arm: Arm, method_class: type, erm_class: type) -> dict[str, Space]:
    space = search_space(erm_class if arm.held.get("lam") == 0 else method_class)
    return {k: v for k, v in space.items() if k not in arm.held}
