"""Which final rows a cell averages: the methods run with a lambda, the ERM rows every K and
method share, and a selection rule's choice among a group's lambdas."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd

from analysis.results import LAM_ATOL, MI_METHOD
from analysis.selection import Choice, NoCandidateError, SelectionRule


def same_value(series: pd.Series, value: float | str | None) -> pd.Series:
    if isinstance(value, str) or value is None:
        return series == value if value is not None else series.isna()
    return pd.Series(np.isclose(series.astype(float), float(value), rtol=0.0, atol=LAM_ATOL,
                                equal_nan=True), index=series.index)


def rows_at(frame: pd.DataFrame, where: Iterable[tuple[str, object]]) -> pd.DataFrame:
    """The rows of `frame` whose columns hold the given values (lambda-style tolerance)."""
    for key, value in where:
        frame = frame[same_value(frame[key], value)]
    return frame


def chosen(rule: SelectionRule, group: pd.DataFrame) -> Choice | None:
    try:
        return rule.choose(group)
    except NoCandidateError:
        return None


def neural_methods(frame: pd.DataFrame) -> list[str]:
    """Methods with a lambda in `frame` (baselines such as the SVM have none): mi_backprop
    first, then the others by name, unknown names included."""
    names = set(frame.loc[frame["lam"].notna(), "method"].dropna().astype(str))
    return sorted(names, key=lambda m: (m != MI_METHOD, m))


def erm_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """The lam = 0 rows of `frame`: plain ERM whatever the method, so a sweep of several
    methods runs it once and every method's group shares it (mi_backprop's when it has any)."""
    zero = frame[np.isclose(frame["lam"].astype(float), 0.0, rtol=0.0, atol=LAM_ATOL)]
    for method in neural_methods(zero):
        rows = zero[zero["method"] == method]
        if len(rows):
            return rows
    return zero


def with_shared_erm(own: pd.DataFrame, frame: pd.DataFrame) -> pd.DataFrame:
    """`own` rows, plus the shared ERM rows of `frame` (lam = 0) when `own` has none."""
    if (np.isclose(own["lam"].astype(float), 0.0, rtol=0.0, atol=LAM_ATOL)).any():
        return own
    return pd.concat([own, erm_rows(frame)], ignore_index=True)
