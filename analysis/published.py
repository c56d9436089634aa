"""The paper's published numbers (Ragonesi et al., CVPR Workshops 2021), shown beside ours as
references. std is NaN where the paper gives none."""

from __future__ import annotations

import math
from dataclasses import dataclass

NAN = math.nan
SIGMA_ATOL = 1e-6  # match our sigma values to the paper's columns with this tolerance


@dataclass(frozen=True)
class PublishedRow:
    row: str
    values: dict[str, tuple[float, float]]  # column -> (mean, std)


# Table 1: test accuracy on Colored MNIST per colour variance sigma.
DIGITS_SIGMAS: tuple[float, ...] = (0.020, 0.025, 0.030, 0.035, 0.040, 0.045, 0.050)
DIGITS: dict[str, list[tuple[float, float]]] = {
    "ERM (λ=0)": list(zip((.476, .542, .664, .720, .785, .838, .870),
                          (.005, .004, .007, .010, .003, .002, .001), strict=True)),
    "Alvi et al.": [(v, NAN) for v in (.676, .713, .794, .825, .868, .890, .917)],
    "Kim et al.": [(v, NAN) for v in (.818, .882, .911, .929, .936, .954, .955)],
    "Ours (λ=1)": list(zip((.864, .925, .959, .973, .975, .980, .982),
                           (.052, .020, .008, .003, .001, .001, .001), strict=True)),
}

# Table 3: German credit, accuracy and equality of opportunity (lower is fairer).
GERMAN_COLUMNS: tuple[str, ...] = ("Acc.", "EO")
GERMAN: list[PublishedRow] = [
    PublishedRow("SVM", {"Acc.": (.74, .03), "EO": (.10, .06)}),
    PublishedRow("FERM", {"Acc.": (.73, .04), "EO": (.05, .03)}),
    PublishedRow("NN", {"Acc.": (.74, .04), "EO": (.47, .19)}),
    PublishedRow("NN + χ²", {"Acc.": (.73, .03), "EO": (.25, .14)}),
    PublishedRow("Ours (λ=1)", {"Acc.": (.72, .03), "EO": (.05, .05)}),
]

# Table 2: IMDB, train on EB1 / EB2, evaluate on the other split and on the test set.
IMDB_COLUMNS: tuple[str, ...] = ("EB1→EB2", "EB1→Test", "EB2→EB1", "EB2→Test")
IMDB_PAPER_LAMBDA: dict[str, float] = {"EB1": 0.5, "EB2": 0.9}
IMDB: list[PublishedRow] = [
    PublishedRow("ERM (λ=0)", dict(zip(IMDB_COLUMNS, [(.650, .020), (.849, .007),
                                                      (.576, .013), (.708, .008)],
                                       strict=True))),
    PublishedRow("Alvi et al.", dict(zip(IMDB_COLUMNS, [(.637, NAN), (.856, NAN),
                                                        (.573, NAN), (.699, NAN)],
                                         strict=True))),
    PublishedRow("Kim et al.", dict(zip(IMDB_COLUMNS, [(.680, NAN), (.867, NAN),
                                                       (.642, NAN), (.745, NAN)],
                                        strict=True))),
    PublishedRow("Ours (λ=0.5 / 0.9)", dict(zip(IMDB_COLUMNS, [(.684, .010), (.872, .010),
                                                               (.631, .036), (.745, .022)],
                                                strict=True))),
]


# How our rows of each method are labelled in the tables; the published rows of the same
# competitors are "Kim et al." and "Alvi et al." (their own code and settings, not ours).
METHOD_LABELS: dict[str, str] = {
    "mi_backprop": "Ours",
    "lntl": "Kim et al. (ours)",
    "confusion": "Alvi et al. (ours)",
    "grad_reversal": "Grad. reversal (ours)",
    "hsic": "HSIC penalty (ours)",
}


# The method of ours that each published competitor row is (their method, our code and
# settings): our rows of it go right above the published row.
PUBLISHED_METHOD: dict[str, str] = {"Alvi et al.": "confusion", "Kim et al.": "lntl"}


def partner_label(published_row: str) -> str:
    """The label our rows of the same method start with, for a published row's name (without
    " (published)"): the competitor's method label, "Ours" for the paper's own rows, else the
    name itself (ERM, SVM, NN)."""
    if published_row in PUBLISHED_METHOD:
        return method_label(PUBLISHED_METHOD[published_row])
    if published_row.startswith("Ours"):
        return METHOD_LABELS["mi_backprop"]
    return published_row.split(" (")[0]


def method_label(method: str) -> str:
    """The table label of our rows of `method` (an unknown method keeps its own name)."""
    return METHOD_LABELS.get(method, f"{method} (ours)")


def digits_published(sigma: float) -> dict[str, tuple[float, float]] | None:
    """Published Table 1 values (row -> (mean, std)) for one sigma, or None when the paper
    has no column within 1e-6 of it."""
    for i, s in enumerate(DIGITS_SIGMAS):
        if abs(s - sigma) <= SIGMA_ATOL:
            return {row: values[i] for row, values in DIGITS.items()}
    return None
