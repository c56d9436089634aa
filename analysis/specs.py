"""What each benchmark's paper table is, as plain data: `TABLE_SPECS[benchmark]`.

analysis.tables builds every paper table from its spec with one builder, and
analysis.results accepts exactly the benchmarks named here, so a benchmark is added by adding
its spec (and its published rows, analysis.published). Imports nothing of analysis but the
published rows, so that any module of it can read the specs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from analysis import published
from analysis.published import PublishedRow


@dataclass(frozen=True)
class Column:
    """One column of a paper table: its label; the results column it reports (the first of
    `metric` the benchmark's rows have); the rows it reads (`where`: column, value pairs);
    the lambda the paper reports there (our "as the paper" row)."""

    label: str
    metric: tuple[str, ...]
    where: tuple[tuple[str, object], ...] = ()
    paper_lam: float = 1.0


@dataclass(frozen=True)
class ColumnAxis:
    """Columns made from the data: one per value of `key` among the benchmark's rows (sorted),
    labelled `axis_label(symbol, value)`, each reporting `metric`. A published row's value for
    a column is the one keyed within `atol` of the column's value."""

    key: str
    symbol: str
    metric: str
    paper_lam: float = 1.0
    atol: float = published.SIGMA_ATOL


@dataclass(frozen=True)
class TableSpec:
    """One benchmark's paper table.

    Per K of mi_backprop a block "<table> (<measures>), K=<K>": a row per `baselines`
    method (those run without a lambda), `erm_row` (lambda 0, run once and shared by every K
    and method), `paper_row` (the column's paper lambda) and a row per selection rule, the
    same for each other method we ran, and the `published` rows beside ours. `note` goes
    under each block's heading (`{metric[LABEL]}`: the results column of column LABEL).
    The table is skipped, saying so, where the rows lack a column of `requires`;
    `bias_strength`: the section of experiment.json's bias strength follows the table.
    """

    benchmark: str
    name: str
    table: str
    measures: str
    columns: tuple[Column, ...] | ColumnAxis
    published: tuple[PublishedRow, ...]
    corner: str = "Method"
    erm_row: str = "ERM (λ=0)"
    paper_row: str = "Ours (λ=1, as the paper)"
    baselines: tuple[tuple[str, str], ...] = ()
    note: str = ""
    requires: tuple[str, ...] = ()
    bias_strength: bool = False

    @property
    def title(self) -> str:
        return f"{self.name} ({self.table})"


def axis_label(symbol: str, value: float) -> str:
    """A column label such as "σ=0.030": three decimals where they are exact, else %g."""
    if not math.isfinite(value):
        return f"{symbol}=–"
    if abs(round(value, 3) - value) < 1e-9:
        return f"{symbol}={value:.3f}"
    return f"{symbol}={value:g}"


DIGITS = TableSpec(
    benchmark="digits", name="Colored MNIST", table="Table 1", measures="test accuracy",
    columns=ColumnAxis(key="sigma", symbol="σ", metric="test_acc"),
    published=published.DIGITS, corner="Training", bias_strength=True,
)

GERMAN = TableSpec(
    benchmark="german", name="German credit", table="Table 3", measures="accuracy, EO",
    columns=(Column("Acc.", ("test_acc",)), Column("EO", ("eo",))),
    published=published.GERMAN, erm_row="NN (λ=0)", baselines=(("svm", "SVM"),),
    note="EO = |TPR(young) − TPR(old)|, lower is fairer.",
)


def _imdb_column(train: str, on: str, metric: tuple[str, ...]) -> Column:
    return Column(f"{train}→{on}", metric, (("train_split", train),),
                  published.IMDB_PAPER_LAMBDA[train])


# The test split's accuracy is `acc_test` where the trainable reports one, else `test_acc`.
_IMDB_TEST = ("acc_test", "test_acc")
IMDB = TableSpec(
    benchmark="imdb", name="IMDB faces", table="Table 2", measures="accuracy",
    columns=(_imdb_column("EB1", "EB2", ("acc_eb2",)), _imdb_column("EB1", "Test", _IMDB_TEST),
             _imdb_column("EB2", "EB1", ("acc_eb1",)), _imdb_column("EB2", "Test", _IMDB_TEST)),
    published=published.IMDB, paper_row="Ours (λ=0.5 on EB1, 0.9 on EB2, as the paper)",
    note="A→B: trained on split A, accuracy on B (Test: `{metric[EB1→Test]}`).",
    requires=("train_split",),
)

# In the order table.md shows them.
TABLE_SPECS: dict[str, TableSpec] = {spec.benchmark: spec for spec in (DIGITS, GERMAN, IMDB)}
