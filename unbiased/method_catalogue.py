"""Every method by name, torch-free: where its class lives, how the tables label our rows of
it, what `--method`'s help says of it, and the published competitor row it reproduces.

`unbiased.methods.METHODS` imports the classes named here; the analysis (which never
imports torch) and the sweeps' help read this module. A new method is its module plus one
entry here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MethodEntry:
    module: str  # the module holding the class, under unbiased.methods
    cls: str  # the class's name
    label: str  # our rows' label in the tables
    about: str  # who it is from, for --method's help
    published_as: str | None = None  # the published row that is this method (their code)


CATALOGUE: dict[str, MethodEntry] = {
    "mi_backprop": MethodEntry("mi_backprop", "MIBackprop", "Ours", "the paper's"),
    "grad_reversal": MethodEntry("grad_reversal", "GradReversal", "Grad. reversal (ours)",
                                 "a bias head through gradient reversal"),
    "confusion": MethodEntry("confusion", "Confusion", "Alvi et al. (ours)", "Alvi et al.",
                             published_as="Alvi et al."),
    "hsic": MethodEntry("hsic", "HSIC", "HSIC penalty (ours)", "an HSIC penalty on z and c"),
    "lntl": MethodEntry("lntl", "LNTL", "Kim et al. (ours)", "Kim et al.",
                        published_as="Kim et al."),
}
DEFAULT_METHOD = "mi_backprop"


def methods_help() -> str:
    """Each method's name and source, for --method's help."""
    return ", ".join(f"{name} ({entry.about})" for name, entry in CATALOGUE.items())
