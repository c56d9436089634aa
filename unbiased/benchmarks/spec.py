"""What a benchmark brings, as plain data: `BenchmarkSpec`, and the paper-table pieces it
holds (`TableSpec`, its columns, the published rows and the protocol they were run under).

Nothing here imports torch, ray or the analysis: the sweep drivers read a spec to build their
flags and grids, the analysis to build its tables, and neither may pay for torch to do so.
A spec's `load`, `describe` and `build` import their data code (torch) when called.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

AXIS_ATOL = 1e-6  # a published row's axis value (sigma, rho) matches ours within this
PAPER = "Ragonesi et al., CVPR Workshops 2021"
# What a smoke preset's table says in place of gaps to the published rows.
SMOKE = "— a smoke run, not comparable with the published rows."


@dataclass(frozen=True)
class PublishedRow:
    """One printed row: column -> (mean, std). A table whose columns come from the data
    (Table 1: one per sigma) keys its rows by that value, the others by column label."""

    row: str
    values: dict[str | float, tuple[float, float]]
    source: str = ""


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
    atol: float = AXIS_ATOL


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


# The objects the driver loads once and every trial gets through Ray's object store, and a
# phrase describing them for the sweep's start line.
Loaded = tuple[dict[str, Any], str]


@dataclass(frozen=True)
class BenchmarkSpec:
    """Everything a benchmark brings to the sweeps, the trainable and the analysis.

    `presets`: preset name -> every value a sweep of it needs (flags override one each).
    `data_axes`: keys swept besides method, lam, K and seed (lists in the presets).
    `build_keys`: trial config keys `build` reads besides the axes and the seed.
    `settings`: a dataclass whose fields (unbiased.settings.setting metadata) are the
    benchmark's own flags, shown under `title`; a field with `many` takes a list (an axis).
    `columns`: per-epoch result columns the benchmark reports beyond the generic ones
    (results.parquet keeps them, and the axes).
    `column_labels`: how table.md names each of `columns` (default: the column's name).
    `axis_labels`: how table.md and the figures name a value of one of `data_axes`, a format of
    `{value}` (default: "<symbol>=<value>" for a number, the symbol being its table's
    ColumnAxis symbol or the axis name; "<axis> <value>" for text).
    `trade_off`: (metric, label) of one of `columns` the analysis draws per lambda beside test
    accuracy (figures/<name>_K<K>_<metric>.png; German: equality of opportunity).
    `summary`: the metrics the driver's closing summary shows.
    `load(values)`: reads the data once in the driver (raising unbiased.data.DataError on the
    user's side of things) -> (objects for the trials, phrase).
    `describe(values, loaded)`: facts about the data for experiment.json and the start lines.
    `extra_rows(values, loaded, like)`: rows of non-neural baselines the sweep adds to the
    trials' (German: an RBF SVM per seed), with the columns and dtypes of `like`.
    `build(config, **loaded)`: the trial's unbiased.data.Benchmark.
    `fetch(values)`: `--fetch-data` (sweeps/fetch.py), on a machine with network: downloads
    the data a sweep of `values` reads (into `root` where it goes there), or checks it, and
    yields lines saying what is there (paths, sizes, rows), or that there is nothing to fetch
    (embedded data); data the program cannot download is a DataError saying where to get it.
    None: `load` stands in. `fetch_keys`: the settings besides the preset and --root that
    decide what `fetch` reads (their flags go into the fetch command an error names).
    `table`: its paper table with the published rows.
    """

    name: str
    title: str
    description: str
    presets: dict[str, dict[str, object]]
    data_axes: tuple[str, ...]
    build_keys: tuple[str, ...]
    load: Callable[[dict], Loaded]
    build: Callable[..., Any]
    table: TableSpec
    settings: type | None = None
    columns: tuple[str, ...] = ()
    column_labels: dict[str, str] = field(default_factory=dict)
    axis_labels: dict[str, str] = field(default_factory=dict)
    trade_off: tuple[str, str] | None = None
    summary: tuple[str, ...] = ("train_acc", "test_acc")
    describe: Callable[[dict, dict], tuple[dict, list[str]]] | None = None
    extra_rows: Callable[[dict, dict, Any], Any] | None = None
    fetch: Callable[[dict], Iterable[str]] | None = None
    fetch_keys: tuple[str, ...] = ()

    def result_columns(self) -> tuple[str, ...]:
        """The columns results.parquet keeps for this benchmark: its metrics, then its axes."""
        return tuple(dict.fromkeys((*self.columns, *self.data_axes)))

    def axis_kinds(self) -> dict[str, str]:
        """Each data axis's results column kind: "string" where the presets list text for
        it, else "float"."""
        kinds = {}
        for axis in self.data_axes:
            values = [v for preset in self.presets.values() for v in preset.get(axis, ())]
            kinds[axis] = "string" if any(isinstance(v, str) for v in values) else "float"
        return kinds


def build_device(config: dict) -> torch.device:
    """Where a build puts its tensors: the trial's device (run_trial resolves `auto` before
    building; a build called on its own takes cuda when there is one)."""
    import torch

    device = str(config.get("device", "auto"))
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(device)
