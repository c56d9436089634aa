"""The hyperparameter distributions of an equal tuning budget, and the arms it compares.

Each method class declares the distributions of the settings it reads (`ERM.search`, merged
along the class's bases: every method draws g and f's lr and weight decay as ERM does, then
its own). An arm is one row of the comparison: a method with some settings held (resampling
is ERM on the group sampler). A tuning preset draws the same number of points for every arm,
with the same epochs and seeds (sweeps/tuning.py draws them through Ray Tune's own search
spaces). Plain data: nothing here imports torch or ray.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class LogUniform:
    """A number drawn uniformly in log space between `low` and `high`."""

    low: float
    high: float

    def __post_init__(self) -> None:
        if not 0 < self.low < self.high:
            raise ValueError(f"LogUniform needs 0 < low < high, got {self.low}, {self.high}")


@dataclass(frozen=True)
class Choice:
    """One of `values`, each as likely."""

    values: tuple[object, ...]

    def __post_init__(self) -> None:
        if not self.values:
            raise ValueError("Choice needs at least one value")


Space = LogUniform | Choice
# A drawn number keeps this many significant digits: a setting reads 0.000835, not
# 0.0008349172..., in the configs, the records and the tables.
DIGITS = 3


@dataclass(frozen=True)
class Arm:
    """One row of the comparison: `method` with the settings in `held` fixed; every other
    setting of the method's search space is drawn. Where lam is held at 0 the method is ERM
    (every method's lam 0 is ERM's own step), so only ERM's own space is drawn."""

    method: str
    label: str
    held: dict[str, object] = field(default_factory=dict)

    @property
    def erm(self) -> bool:
        return self.held.get("lam") == 0


# The rows the field compares on a group benchmark (Biased MNIST; Colored MNIST's palette
# groups): ERM, resampling, reweighting, Group DRO, ours three ways, Kim et al.'s. ERM's two
# arms run under group_reweight, whose lam 0 is ERM's step with nothing else trained.
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
    """A method class's distributions: its bases' `search`, then its own, over them."""
    space: dict[str, Space] = {}
    for cls in reversed(method_class.__mro__):
        space.update(cls.__dict__.get("search", {}))
    return space


def arm_space(arm: Arm, method_class: type, erm_class: type) -> dict[str, Space]:
    """What an arm draws: its method's space (ERM's where lam is held at 0) less what it
    holds."""
    space = search_space(erm_class if arm.erm else method_class)
    return {k: v for k, v in space.items() if k not in arm.held}
