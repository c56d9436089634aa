"""Model-selection rules (DomainBed style): which lambda to report for one group of trials
(benchmark, K, method, each data axis the rows have), from its kept seeds averaged per lambda.

The label-free rules pass over a lambda whose fresh estimate failed on some seed
(`estimator_failed`): a failed estimator reads ~0 and would otherwise win.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pandas as pd

from analysis.results import FLOOR_MARGIN_NATS, LAM_ATOL, per_lambda

TIE_ATOL = 1e-9  # MI / accuracy values closer than this are a tie (-> the higher lambda)
_FIT_EPS = 1e-12  # float slack on the train-accuracy tolerance


@dataclass(frozen=True)
class Choice:
    lam: float
    rule: str
    reason: str


class NoCandidateError(ValueError):
    """Every trial of the group was excluded (diverged/failed): nothing to choose from."""


def candidates(finals: pd.DataFrame) -> pd.DataFrame:
    """Per-lambda means over kept seeds; a lambda with no kept trial is not a candidate."""
    table = per_lambda(finals)
    table = table[table["n"] > 0].reset_index(drop=True)
    if table.empty:
        raise NoCandidateError("no non-diverged trial in this group")
    return table


def mi_column(table: pd.DataFrame) -> str:
    """`mi_eval` (fresh statistics network) when every row has it, else the training `mi`."""
    if "mi_eval" in table.columns and len(table) and table["mi_eval"].notna().all():
        return "mi_eval"
    return "mi"


def measured(table: pd.DataFrame) -> pd.Series:
    """Per-lambda rows (`per_lambda`) whose MI every kept seed measured: no failed estimate."""
    if "n_failed" not in table.columns:
        return pd.Series(True, index=table.index)
    return table["n_failed"].fillna(0).astype(int) == 0


def _lams(values: pd.Series) -> str:
    return ", ".join(f"{v:g}" for v in values)


class SelectionRule(ABC):
    """`name` is shown in tables; `key` is the short id (docs/DESIGN.md's rule names)."""

    name: ClassVar[str]
    key: ClassVar[str]
    label_free: ClassVar[bool]

    @abstractmethod
    def choose(self, finals: pd.DataFrame) -> Choice:
        """Choose a lambda from the final-epoch rows of one group."""


class _FitsTraining(SelectionRule, ABC):
    def __init__(self, tolerance: float = 0.05) -> None:
        if not (tolerance >= 0 and math.isfinite(tolerance)):
            raise ValueError(f"tolerance must be a finite number >= 0, got {tolerance}")
        self.tolerance = tolerance

    def _fits(self, table: pd.DataFrame) -> tuple[pd.Series, float]:
        best = float(table["train_acc"].max())
        return table["train_acc"] >= best - self.tolerance - _FIT_EPS, best

    def _rejected(self, table: pd.DataFrame, fits: pd.Series) -> str:
        out = table[~fits]
        text = ""
        if not out.empty:
            items = ", ".join(f"λ={r.lam:g} ({r.train_acc:.3f})" for r in out.itertuples())
            text = f"; rejected, train acc not within {self.tolerance:g} of best: {items}"
        failed = table[~measured(table)]
        if not failed.empty:
            text += (f"; MI not measured (fresh T read > {FLOOR_MARGIN_NATS:g} nats below its "
                     f"prediction floor): λ ∈ {{{_lams(failed['lam'])}}}")
        return text

    def __repr__(self) -> str:
        return f"{type(self).__name__}(tolerance={self.tolerance:g})"


class LowestMI(_FitsTraining):
    """The lowest MI among lambdas that fit (mean train accuracy within `tolerance` of the
    best) and were `measured`; ties go to the higher lambda. Uses no test labels."""

    name = "lowest-MI (label-free)"
    key = "lowest_mi"
    label_free = True

    def choose(self, finals: pd.DataFrame) -> Choice:
        table = candidates(finals)
        fits, best = self._fits(table)
        fitting = table[fits & measured(table)]
        if fitting.empty:
            raise NoCandidateError("no lambda both fits and has a measured MI"
                                   + self._rejected(table, fits))
        col = mi_column(fitting)
        low = float(fitting[col].min())
        tied = fitting[fitting[col] <= low + TIE_ATOL]
        lam = float(tied["lam"].max())
        reason = (f"lowest {col} ({low:.4g} nats) among λ ∈ {{{_lams(fitting['lam'])}}} "
                  f"fitting within {self.tolerance:g} of best train acc {best:.3f}")
        if len(tied) > 1:
            reason += f"; tie between λ ∈ {{{_lams(tied['lam'])}}} -> highest"
        return Choice(lam, self.name, reason + self._rejected(table, fits))


class HighestFittingLambda(_FitsTraining):
    """The paper's wording: the highest lambda that still fits the training data (mean train
    accuracy within `tolerance` of the best), has a measured MI and lowers it below
    lambda=0's. Falls back to lambda=0 when no lambda does all three. Uses no test labels."""

    name = "highest-fitting-λ (label-free)"
    key = "highest_fitting_lambda"
    label_free = True

    def choose(self, finals: pd.DataFrame) -> Choice:
        table = candidates(finals)
        fits, best = self._fits(table)
        is_zero = pd.Series(np.isclose(table["lam"], 0.0, rtol=0.0, atol=LAM_ATOL),
                            index=table.index)
        fit_text = f"fits (train acc within {self.tolerance:g} of best {best:.3f})"
        known = measured(table)
        if not is_zero.any():
            if not (fits & known).any():
                raise NoCandidateError("no lambda both fits and has a measured MI"
                                       + self._rejected(table, fits))
            lam = float(table.loc[fits & known, "lam"].max())
            return Choice(lam, self.name, f"no kept λ=0 trial to compare MI with; highest λ "
                          f"that {fit_text}" + self._rejected(table, fits))
        col = mi_column(table[fits | is_zero])
        ref = float(table.loc[is_zero, col].iloc[0])
        lowers = table[col] < ref - TIE_ATOL
        ok = table[fits & known & lowers & ~is_zero]
        if ok.empty:
            return Choice(0.0, self.name, f"no λ>0 both {fit_text} and lowers {col} below "
                          f"λ=0's ({ref:.4g}); fell back to λ=0" + self._rejected(table, fits))
        row = ok.loc[ok["lam"].idxmax()]
        return Choice(float(row["lam"]), self.name,
                      f"highest λ that {fit_text} and lowers {col} to {row[col]:.4g} "
                      f"(λ=0: {ref:.4g})" + self._rejected(table, fits))


class OracleTest(SelectionRule):
    """Best mean test accuracy (ties -> higher lambda). It peeks at test labels: a reference
    upper bound for the label-free rules, never a model-selection method."""

    name = "oracle (peeks at test labels)"
    key = "oracle_test"
    label_free = False

    def choose(self, finals: pd.DataFrame) -> Choice:
        table = candidates(finals)
        top = float(table["test_acc"].max())
        tied = table[table["test_acc"] >= top - TIE_ATOL]
        lam = float(tied["lam"].max())
        reason = f"best mean test_acc ({top:.4f}) among λ ∈ {{{_lams(table['lam'])}}}"
        if len(tied) > 1:
            reason += f"; tie between λ ∈ {{{_lams(tied['lam'])}}} -> highest"
        return Choice(lam, self.name, reason)


def default_rules(tolerance: float = 0.05) -> tuple[SelectionRule, ...]:
    """The rules every table reports, label-free ones first, the oracle last."""
    return (LowestMI(tolerance), HighestFittingLambda(tolerance), OracleTest())
