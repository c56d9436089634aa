"""The paper's published numbers (Ragonesi et al., CVPR Workshops 2021), shown beside ours as
references. std is NaN where the paper gives none."""

from __future__ import annotations

import math
from dataclasses import dataclass

NAN = math.nan
SIGMA_ATOL = 1e-6  # match our sigma values to the paper's columns with this tolerance


@dataclass(frozen=True)
class PublishedRow:
    """One printed row: column -> (mean, std). A table whose columns come from the data
    (Table 1: one per sigma) keys its rows by that value, the others by column label."""

    row: str
    values: dict[str | float, tuple[float, float]]
    source: str = ""


PAPER = "Ragonesi et al., CVPR Workshops 2021"
# The paper's competitor rows of Table 1 are Kim et al.'s runs on Kim's own protocol, not the
# paper's (docs/MEASURED.md, "Where the published competitor rows come from").
KIM_FIG4 = (f"{PAPER}, Table 1: Kim et al.'s runs (CVPR 2019, Fig. 4; their network and "
            "SGD schedule, not the paper's)")

# Table 1: test accuracy on Colored MNIST per colour variance sigma.
DIGITS_SIGMAS: tuple[float, ...] = (0.020, 0.025, 0.030, 0.035, 0.040, 0.045, 0.050)


def _per_sigma(means: tuple[float, ...], stds: tuple[float, ...] | None = None
               ) -> dict[str | float, tuple[float, float]]:
    stds = stds or tuple(NAN for _ in means)
    return dict(zip(DIGITS_SIGMAS, zip(means, stds, strict=True), strict=True))


DIGITS: tuple[PublishedRow, ...] = (
    PublishedRow("ERM (λ=0)", _per_sigma((.476, .542, .664, .720, .785, .838, .870),
                                         (.005, .004, .007, .010, .003, .002, .001)),
                 f"{PAPER}, Table 1"),
    PublishedRow("Alvi et al.", _per_sigma((.676, .713, .794, .825, .868, .890, .917)),
                 KIM_FIG4),
    PublishedRow("Kim et al.", _per_sigma((.818, .882, .911, .929, .936, .954, .955)),
                 KIM_FIG4),
    PublishedRow("Ours (λ=1)", _per_sigma((.864, .925, .959, .973, .975, .980, .982),
                                          (.052, .020, .008, .003, .001, .001, .001)),
                 f"{PAPER}, Table 1"),
)

# Table 3: German credit, accuracy and equality of opportunity (lower is fairer).
GERMAN_COLUMNS: tuple[str, ...] = ("Acc.", "EO")
GERMAN: tuple[PublishedRow, ...] = tuple(
    PublishedRow(row, dict(zip(GERMAN_COLUMNS, values, strict=True)), f"{PAPER}, Table 3")
    for row, values in (
        ("SVM", ((.74, .03), (.10, .06))),
        ("FERM", ((.73, .04), (.05, .03))),
        ("NN", ((.74, .04), (.47, .19))),
        ("NN + χ²", ((.73, .03), (.25, .14))),
        ("Ours (λ=1)", ((.72, .03), (.05, .05))),
    ))

# Table 2: IMDB, train on EB1 / EB2, evaluate on the other split and on the test set.
IMDB_COLUMNS: tuple[str, ...] = ("EB1→EB2", "EB1→Test", "EB2→EB1", "EB2→Test")
IMDB_PAPER_LAMBDA: dict[str, float] = {"EB1": 0.5, "EB2": 0.9}
IMDB: tuple[PublishedRow, ...] = tuple(
    PublishedRow(row, dict(zip(IMDB_COLUMNS, values, strict=True)), f"{PAPER}, Table 2")
    for row, values in (
        ("ERM (λ=0)", ((.650, .020), (.849, .007), (.576, .013), (.708, .008))),
        ("Alvi et al.", ((.637, NAN), (.856, NAN), (.573, NAN), (.699, NAN))),
        ("Kim et al.", ((.680, NAN), (.867, NAN), (.642, NAN), (.745, NAN))),
        ("Ours (λ=0.5 / 0.9)", ((.684, .010), (.872, .010), (.631, .036), (.745, .022))),
    ))


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
