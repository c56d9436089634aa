"""Every method by name, torch-free, so the analysis and the sweeps' help can read it.

A method of another installed package is an entry point in the group ENTRY_POINTS,
`NAME = "package.module:ENTRY"`, naming a MethodEntry in a torch-free module.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib.metadata import entry_points

from unbiased.registry_error import RegistryError

ENTRY_POINTS = "unbiased.methods"


@dataclass(frozen=True)
class MethodEntry:
    module: str  # the module holding the class: under unbiased.methods, or a dotted path
    cls: str  # the class's name
    label: str  # our rows' label in the tables
    about: str  # who it is from, for --method's help
    published_as: str | None = None  # the published row that is this method (their code)

    def module_path(self) -> str:
        return self.module if "." in self.module else f"unbiased.methods.{self.module}"


CATALOGUE: dict[str, MethodEntry] = {
    "mi_backprop": MethodEntry("mi_backprop", "MIBackprop", "Ours", "the paper's"),
    "grad_reversal": MethodEntry("grad_reversal", "GradReversal", "Grad. reversal (ours)",
                                 "a bias head through gradient reversal"),
    "confusion": MethodEntry("confusion", "Confusion", "Alvi et al. (ours)", "Alvi et al.",
                             published_as="Alvi et al."),
    "hsic": MethodEntry("hsic", "HSIC", "HSIC penalty (ours)", "an HSIC penalty on z and c"),
    "lntl": MethodEntry("lntl", "LNTL", "Kim et al. (ours)", "Kim et al.",
                        published_as="Kim et al."),
    "group_reweight": MethodEntry("group_reweight", "GroupReweight", "Group reweighting (ours)",
                                  "(y, c) groups weighed by inverse frequency ^ lam"),
    "group_dro": MethodEntry("group_dro", "GroupDRO", "Group DRO (ours)",
                             "Sagawa et al.'s online Group DRO over (y, c) groups"),
}
DEFAULT_METHOD = "mi_backprop"


@cache
def catalogue() -> dict[str, MethodEntry]:
    out = dict(CATALOGUE)
    for point in entry_points(group=ENTRY_POINTS):
        where = f"entry point {point.name} = {point.value} (group {ENTRY_POINTS})"
        if point.name in out:
            raise RegistryError(f"{where}: method {point.name!r} is registered already")
        try:
            entry = point.load()
        except (ImportError, AttributeError) as exc:
            raise RegistryError(f"{where}: cannot load it ({type(exc).__name__}: {exc})"
                                ) from None
        if not isinstance(entry, MethodEntry):
            raise RegistryError(f"{where}: names a {type(entry).__name__}, not a MethodEntry")
        out[point.name] = entry
    return out


def methods_help() -> str:
    return ", ".join(f"{name} ({entry.about})" for name, entry in catalogue().items())
