"""The registry's benchmarks as the analysis reads them: `TABLE_SPECS[benchmark]` (in the
registry's order), their metrics and data axes. A benchmark is added by registering it; the
dataclasses live in unbiased/benchmarks/spec.py (torch-free)."""

from __future__ import annotations

import math
from collections.abc import Mapping

import pandas as pd

from unbiased.benchmarks import all_specs
from unbiased.benchmarks.spec import Column, ColumnAxis, Protocol, TableSpec

__all__ = ["AXIS_FORMATS", "AXIS_KINDS", "AXIS_SYMBOLS", "BENCHMARK_METRICS", "DATA_AXES",
           "METRIC_LABELS", "TABLE_SPECS", "TRADE_OFFS", "Column", "ColumnAxis", "Protocol",
           "TableSpec", "axis_label", "axis_value_label", "data_labels", "present_axes",
           "valued_axes"]


def axis_label(symbol: str, value: float) -> str:
    """A column label such as "σ=0.030": three decimals where they are exact, else %g."""
    if not math.isfinite(value):
        return f"{symbol}=–"
    if abs(round(value, 3) - value) < 1e-9:
        return f"{symbol}={value:.3f}"
    return f"{symbol}={value:g}"


TABLE_SPECS: dict[str, TableSpec] = {spec.name: spec.table for spec in all_specs()}
BENCHMARK_METRICS: tuple[str, ...] = tuple(dict.fromkeys(
    c for spec in all_specs() for c in spec.columns))
TRADE_OFFS: dict[str, tuple[str, str]] = {spec.name: spec.trade_off for spec in all_specs()
                                          if spec.trade_off is not None}
METRIC_LABELS: dict[str, str] = {c: spec.column_labels.get(c, c) for spec in all_specs()
                                 for c in spec.columns}
# Each value of a data axis is a selection group of its own.
DATA_AXES: tuple[str, ...] = tuple(dict.fromkeys(
    a for spec in all_specs() for a in spec.data_axes))
# Each data axis's results column kind ("float" or "string") and its label format, if any.
AXIS_KINDS: dict[str, str] = {a: kind for spec in all_specs()
                              for a, kind in spec.axis_kinds().items()}
AXIS_FORMATS: dict[str, str] = {a: fmt for spec in all_specs()
                                for a, fmt in spec.axis_labels.items()}
# The symbol of each data axis that is a table's columns (σ, ρ), for labels of its values.
AXIS_SYMBOLS: dict[str, str] = {spec.columns.key: spec.columns.symbol
                                for spec in TABLE_SPECS.values()
                                if isinstance(spec.columns, ColumnAxis)}


def present_axes(columns: object) -> list[str]:
    """The registry's data axes among `columns`, in the registry's order."""
    return [axis for axis in DATA_AXES if axis in columns]  # type: ignore[operator]


def valued_axes(frame: pd.DataFrame) -> list[str]:
    """The registry's data axes `frame` has a value of somewhere."""
    return [axis for axis in present_axes(frame.columns) if frame[axis].notna().any()]


def data_labels(values: Mapping[str, object]) -> list[str]:
    """The labels of a row's (or a group key's) values on the registry's data axes."""
    return [label for axis in DATA_AXES if axis in values
            if (label := axis_value_label(axis, values[axis])) is not None]


def axis_value_label(axis: str, value: object) -> str | None:
    """A label of one data axis value ("σ=0.030", "train EB1"); None for NaN."""
    if isinstance(value, str):
        return AXIS_FORMATS.get(axis, f"{axis} {{value}}").format(value=value)
    if isinstance(value, float) and math.isfinite(value):
        if axis in AXIS_FORMATS:
            return AXIS_FORMATS[axis].format(value=f"{value:g}")
        return axis_label(AXIS_SYMBOLS.get(axis, axis), value)
    return None
