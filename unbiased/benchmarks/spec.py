"""What a benchmark brings, as plain data: `BenchmarkSpec` and its paper table.

Nothing here imports torch: the sweep drivers and the analysis read specs and may not pay for
torch to do so; a spec's `load`, `describe` and `build` import their data code when called.
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
    """One column of a paper table: it reports the first of `metric` the rows have, on the
    rows `where` selects; `paper_lam` is the lambda the paper reports there."""

    label: str
    metric: tuple[str, ...]
    where: tuple[tuple[str, object], ...] = ()
    paper_lam: float = 1.0


@dataclass(frozen=True)
class ColumnAxis:
    """Columns made from the data: one per value of `key` among the rows. A published row's
    value for a column is the one keyed within `atol` of the column's value."""

    key: str
    symbol: str
    metric: str
    paper_lam: float = 1.0
    atol: float = AXIS_ATOL


@dataclass(frozen=True)
class Protocol:
    """Which runs may be set against the published rows in std units: a preset in
    `comparable` whose experiment.json agrees with `settings`. Any other preset's table
    says what its runs are instead: `notes[preset]`, else `other`, formatted with
    experiment.json's values, `preset` and `train_rows` (`rows` of the `source`)."""

    comparable: frozenset[str]
    settings: dict[str, object] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)
    other: str = ("{preset} preset: not the protocol of the published rows, so not "
                  "comparable with them.")
    rows: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class TableSpec:
    """One benchmark's paper table. `note` goes under each block's heading
    (`{metric[LABEL]}`: the results column of column LABEL); the table is skipped where the
    rows lack a column of `requires`; `protocol` None compares every run's cells.
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


@dataclass(frozen=True)
class BenchmarkSpec:
    """Everything a benchmark brings to the sweeps, the trainable and the analysis.

    `data_axes`: keys swept besides method, lam, K and seed.
    `build_keys`: trial config keys `build` reads besides the axes and the seed.
    `settings`: a dataclass of `setting` fields, the benchmark's own flags.
    `columns`: per-epoch result columns beyond the generic ones.
    `axis_labels`: a format of `{value}` naming a value of one of `data_axes`.
    `trade_off`: (metric, label) the analysis draws per lambda beside test accuracy.
    `load(values)`: reads the data once in the driver -> (objects for the trials, phrase).
    `extra_rows(values, loaded, like)`: rows of non-neural baselines, like `like`.
    `fetch(values)`: `--fetch-data` (None: `load` stands in); `fetch_keys`: what it reads.
    """

    name: str
    title: str
    description: str
    presets: dict[str, dict[str, object]]
    data_axes: tuple[str, ...]
    build_keys: tuple[str, ...]
    load: Callable[[dict], tuple[dict[str, Any], str]]
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
        return tuple(dict.fromkeys((*self.columns, *self.data_axes)))

    def axis_kinds(self) -> dict[str, str]:
        return {axis: "string" if any(isinstance(v, str) for preset in self.presets.values()
                                      for v in preset.get(axis, ())) else "float"
                for axis in self.data_axes}


def build_device(config: dict) -> torch.device:
    """The trial's device (a build called on its own resolves `auto` itself)."""
    import torch

    device = str(config.get("device", "auto"))
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(device)


def bias_strength_line(rows: list[dict], axis: str, head: str) -> str:
    """The start line of the mean `colour_only_acc` of `rows` at each value of `axis`."""
    means: dict[float, list[float]] = {}
    for row in rows:
        means.setdefault(row[axis], []).append(row["colour_only_acc"])
    return (f"{head}: colour alone classifies "
            + ", ".join(f"{sum(v) / len(v):.3f} at {axis} {a:g}" for a, v in means.items())
            + " of the training digits")
