"""How the published rows beside ours are labelled. The rows themselves are each benchmark's
(`TableSpec.published` in its spec module, unbiased/benchmarks/); std is NaN where a paper
gives none."""

from __future__ import annotations

from unbiased.benchmarks.spec import PublishedRow
from unbiased.method_catalogue import DEFAULT_METHOD, catalogue

__all__ = ["PublishedRow", "METHOD_LABELS", "PUBLISHED_METHOD", "method_label", "partner_label"]

# The published rows of the same competitors are "Kim et al." and "Alvi et al.": their own
# code and settings, not ours.
METHOD_LABELS: dict[str, str] = {name: entry.label for name, entry in catalogue().items()}

# Our rows of a published competitor's method go right above its published row.
PUBLISHED_METHOD: dict[str, str] = {entry.published_as: name
                                    for name, entry in catalogue().items() if entry.published_as}


def partner_label(published_row: str) -> str:
    """The label our rows of the same method start with, for a published row's name (without
    " (published)"); ERM, SVM, NN keep their own."""
    if published_row in PUBLISHED_METHOD:
        return method_label(PUBLISHED_METHOD[published_row])
    if published_row.startswith("Ours"):
        return METHOD_LABELS[DEFAULT_METHOD]
    return published_row.split(" (")[0]


def method_label(method: str) -> str:
    """The table label of our rows of `method` (an unknown method keeps its own name)."""
    return METHOD_LABELS.get(method, f"{method} (ours)")
